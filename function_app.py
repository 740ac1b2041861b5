"""The Settle function app: builds the one ``FunctionApp`` and registers the blueprints.

No I/O happens here; storage and Service Bus clients are created on first use.
"""

import azure.functions as func

from common.api import bp as meta_bp
from console.functions import bp as console_bp
from handoff.functions import bp as handoff_bp
from management.action_functions import bp as actions_bp
from management.functions import bp as management_bp
from management.layout_functions import bp as layout_bp
from management.poison_functions import bp as poison_bp
from management.record_functions import bp as records_bp
from state.functions import bp as state_bp

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(meta_bp)
app.register_functions(state_bp)
app.register_functions(handoff_bp)
app.register_functions(management_bp)
app.register_functions(actions_bp)
app.register_functions(poison_bp)
app.register_functions(records_bp)
app.register_functions(layout_bp)
app.register_functions(console_bp)
