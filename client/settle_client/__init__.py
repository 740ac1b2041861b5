"""settle-client: the Python client of Settle.

``with client.processing(key) as item:`` turns the seeds' lock → act → record pattern into one block;
``client.handoffs.watch(endpoint)`` is a hand-off agent loop. See the package README.
"""

from settle_client._version import VERSION
from settle_client.address import default_url
from settle_client.aio import AsyncProcessing, AsyncSettleClient
from settle_client.client import Processing, SettleClient
from settle_client.enums import EXISTS_STATUSES, HANDLERS, SETTABLE_STATUSES, Scope, Status
from settle_client.errors import (
    AlreadyProcessed,
    Conflict,
    ContentTruncated,
    InvalidInput,
    LeaseLost,
    LockHeld,
    LockLost,
    LockNotAcquired,
    NotFound,
    PayloadMismatch,
    PayloadTooLarge,
    ResultNotStored,
    ServerError,
    SettleError,
    TransportFailure,
    Unauthorized,
    Unavailable,
)
from settle_client.handoffs import AsyncHandoff, Handoff
from settle_client.models import (
    AuditEntry,
    Coordinates,
    Event,
    ExtendResult,
    Handler,
    HistoryEntry,
    Key,
    LockResult,
    Meta,
    Metadata,
    PreviousAttempt,
    Record,
    SettlementAccepted,
)
from settle_client.operator import Operator
from settle_client.operator_models import (
    ActionAccepted,
    BulkAnswer,
    FoundEvent,
    IdMatch,
    OperatorEvent,
    PoisonEntry,
    RecordLookup,
    ReplayAnswer,
    SettlementResolved,
    SettlementView,
)
from settle_client.processing import Item
from settle_client.retry import RetryPolicy
from settle_client.shutdown import Terminated, release_open_blocks

__all__ = [
    "EXISTS_STATUSES",
    "HANDLERS",
    "SETTABLE_STATUSES",
    "ActionAccepted",
    "AlreadyProcessed",
    "AsyncHandoff",
    "AsyncProcessing",
    "AsyncSettleClient",
    "AuditEntry",
    "BulkAnswer",
    "Conflict",
    "ContentTruncated",
    "Coordinates",
    "Event",
    "ExtendResult",
    "FoundEvent",
    "Handler",
    "Handoff",
    "HistoryEntry",
    "IdMatch",
    "InvalidInput",
    "Item",
    "Key",
    "LeaseLost",
    "LockHeld",
    "LockLost",
    "LockNotAcquired",
    "LockResult",
    "Meta",
    "Metadata",
    "NotFound",
    "Operator",
    "OperatorEvent",
    "PayloadMismatch",
    "PayloadTooLarge",
    "PoisonEntry",
    "PreviousAttempt",
    "Processing",
    "Record",
    "RecordLookup",
    "ReplayAnswer",
    "ResultNotStored",
    "RetryPolicy",
    "Scope",
    "ServerError",
    "SettleClient",
    "SettleError",
    "SettlementAccepted",
    "SettlementResolved",
    "SettlementView",
    "Status",
    "Terminated",
    "TransportFailure",
    "Unauthorized",
    "Unavailable",
    "default_url",
    "release_open_blocks",
]

__version__ = VERSION
