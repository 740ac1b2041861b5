"""What a projection writes, column for column and operation for operation (``handoff.projection.rules``): the
event row a message projects, and the one transaction that writes it with its index, listing and count
rows. The audit and delta rows' random suffix is the only part not compared."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from common import transactions as tx
from handoff.messages.contract import (
    HANDOFF_SUB_STATUS,
    ErrorPart,
    InboundMessage,
    MessageContent,
    MessageType,
    ResolutionStatus,
)
from handoff.projection.rules import history_row, plan_projection, project
from handoff.storage import counts, keys
from handoff.storage.records import EventRow, ListingRow, QueueRow, columns_of

from .projected import EVENT, PK, T0, applied, message, stored


def test_an_event_request_projects_a_pending_row_counted_in_the_pending_group() -> None:
    m = message(MessageType.EventRequest, "m-request")

    row = applied(m)

    assert row.resolution_status is ResolutionStatus.Pending and row.pending_sub_status is None
    assert (row.last_message_id, row.updated_at, row.request_enqueued_at) == ("m-request", T0, T0)
    assert (row.handoff_seen, row.history_count, row.counted, row.processing_time_ms) == (False, 1, True, 40)
    assert (row.queue_key, row.job_key, row.expiry_key, row.reason) == (None, None, None, None)
    assert row.all_key is None  # one listing row per event, in its status's range (ADR-0022)
    assert row.listing_keys == [keys.bucket_row("Pending", T0, EVENT)]
    assert (row.since_key, row.since_at) == (None, T0)
    assert (row.session_id, row.correlation_id, row.event_type_id) == (
        "s-1",
        "corr-1",
        "Billing.InvoiceCreated",
    )
    assert row.message_content == m.body_text and row.input_notes is None


def test_a_park_projects_pending_handoff_with_its_queue_row_and_no_job_or_expiry_row() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request")))
    expected_by = T0 + timedelta(hours=1)
    m = message(
        MessageType.PendingHandoffResponse,
        "m-park",
        at=5,
        parent_message_id="m-request",
        external_job_id="job-9",
        expected_by=expected_by,
    )

    row = applied(m, request, now=T0 + timedelta(seconds=6))

    assert row.is_pending_handoff and row.pending_sub_status == HANDOFF_SUB_STATUS
    assert row.queue_key == keys.queue_row(T0 + timedelta(seconds=5), EVENT)
    assert row.job_key is None  # the job lookup reads the lookup index (hoids), ADR-0022
    assert row.expiry_key is None and row.expected_by == expected_by  # the queue row carries it (ADR-0022)
    assert row.handoff_seen and row.history_count == 2 and row.request_enqueued_at == T0
    assert row.since_key is None and row.since_at == T0  # still in the pending group
    later = T0 + timedelta(seconds=6)
    assert row.listing_keys == [keys.bucket_row("Pending", later, EVENT)]  # no PendingHandoff row


def test_a_job_id_of_any_length_is_kept_on_the_row_and_plans_no_job_row() -> None:
    m = message(MessageType.PendingHandoffResponse, "m-park", external_job_id="j" * 2000)

    row = applied(m)

    assert row.job_key is None and row.external_job_id == "j" * 2000
    assert row.input_notes is None  # the lookup index keys an id of any length by its digest
    assert row.queue_key is not None


def test_a_terminal_response_after_a_park_reports_the_time_since_the_request() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request")))
    park = stored(applied(message(MessageType.PendingHandoffResponse, "m-park", at=1), request), '"e2"')
    m = message(MessageType.ResolutionResponse, "m-done", at=30)

    row = applied(m, park, now=T0 + timedelta(seconds=31))

    assert row.resolution_status is ResolutionStatus.Completed and row.pending_sub_status is None
    assert row.processing_time_ms == 31_000 and row.history_count == 3
    assert (row.queue_key, row.since_key, row.since_at) == (None, None, None)


def test_a_terminal_response_without_a_hand_off_keeps_its_own_processing_time() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request")))

    row = applied(message(MessageType.ErrorResponse, "m-err", at=3), request, now=T0 + timedelta(seconds=4))

    assert row.resolution_status is ResolutionStatus.Failed and row.processing_time_ms == 40
    assert row.since_at == T0 + timedelta(seconds=4) and row.since_key is None
    assert row.listing_keys == [keys.bucket_row("Failed", T0 + timedelta(seconds=4), EVENT)]


def test_an_earlier_request_copy_moves_the_request_time_back() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request", at=10)))

    row = applied(message(MessageType.EventRequest, "m-request-2", at=4), request)

    assert row.request_enqueued_at == T0 + timedelta(seconds=4)
    later = applied(message(MessageType.EventRequest, "m-request-3", at=20), stored(row))
    assert later.request_enqueued_at == T0 + timedelta(seconds=4)


def test_a_skip_response_gives_its_error_text_as_the_reason_and_a_dead_letter_its_description() -> None:
    skip = message(
        MessageType.SkipResponse,
        "m-skip",
        content=MessageContent(ErrorContent=ErrorPart(ErrorText="not ours")),
    )
    dead = message(MessageType.ErrorResponse, "m-dead", dead_letter_error_description="too many tries")

    assert applied(skip).reason == "not ours"
    dead_row = applied(dead)
    assert dead_row.reason == "too many tries" and dead_row.resolution_status is ResolutionStatus.DeadLettered
    assert applied(message(MessageType.ErrorResponse, "m-err")).reason is None


def test_the_first_message_writes_history_event_index_and_listing_rows_and_no_count_of_an_open_status() -> (
    None
):
    m = message(MessageType.PendingHandoffResponse, "m-park", external_job_id="job-9", expected_by=T0)
    decision = project(m, None, now=T0)
    row = decision.row
    assert row is not None

    ops = plan_projection(PK, m, None, decision, now=T0)

    listing = columns_of(ListingRow, row, reason=None)
    expected = [
        tx.insert(history_row(m, now=T0, sequence=1).to_entity(PK, keys.history_row(EVENT, "m-park"))),
        tx.insert(row.to_entity(PK, keys.event_row(EVENT))),
        tx.insert(
            QueueRow(
                event_id=EVENT, event_type_id=row.event_type_id, parked_message_id="m-park", expected_by=T0
            ).to_entity(PK, str(row.queue_key))
        ),
        tx.insert(listing.to_entity(PK, keys.bucket_row("Pending", T0, EVENT))),
    ]
    assert ops == expected  # open statuses are counted from their listing rows: no delta
    assert listing.since_at == T0  # the overview's oldest age is read from the listing row


def test_a_later_message_replaces_the_row_as_read_and_moves_only_what_changed() -> None:
    park = stored(
        applied(
            message(MessageType.PendingHandoffResponse, "m-park", external_job_id="job-9", expected_by=T0)
        )
    )
    m = message(MessageType.ResolutionResponse, "m-done", at=5)
    later = T0 + timedelta(seconds=5)
    decision = project(m, park, now=later)
    row = decision.row
    assert row is not None

    ops = plan_projection(PK, m, park, decision, now=later)

    listing = columns_of(ListingRow, row, reason=None)
    expected = [
        tx.insert(history_row(m, now=later, sequence=2).to_entity(PK, keys.history_row(EVENT, "m-done"))),
        tx.replace(row.to_entity(PK, keys.event_row(EVENT)), '"e1"'),
        tx.delete(PK, str(park.queue_key)),
        tx.delete(PK, keys.bucket_row("Pending", T0, EVENT)),
        tx.insert(listing.to_entity(PK, keys.bucket_row("Completed", later, EVENT))),
    ]
    assert ops[: len(expected)] == expected
    delta = ops[-1][1]
    assert ops[-1][0] == "create" and str(delta["RowKey"]).startswith(keys.delta_row(later, ""))
    assert delta["PartitionKey"] == PK
    # only the tallied bucket's change: the open ones are counted from the listing rows
    assert {k: v for k, v in delta.items() if k not in ("PartitionKey", "RowKey")} == {
        counts.column("Completed"): 1,
    }
    assert len(ops) == len(expected) + 1 and listing.since_at is None


def test_a_refused_message_writes_its_history_its_comment_and_the_bookkeeping_only() -> None:
    done = stored(applied(message(MessageType.ResolutionResponse, "m-done")), '"e3"')
    late = message(MessageType.EventRequest, "m-late", at=-5)
    decision = project(late, done, now=T0)

    ops = plan_projection(PK, late, done, decision, now=T0)

    assert not decision.applied
    assert ops[0] == tx.insert(
        history_row(late, now=T0, sequence=2).to_entity(PK, keys.history_row(EVENT, "m-late"))
    )
    audit = ops[1][1]
    assert ops[1][0] == "create" and audit["AuditorName"] == "Resolver" and audit["AuditType"] == "Comment"
    assert audit["PartitionKey"] == PK
    prefix = keys.audit_row(EVENT, T0, "")
    assert str(audit["RowKey"]).startswith(prefix) and len(str(audit["RowKey"])) == len(prefix) + 32
    assert ops[2] == tx.merge(
        {
            "PartitionKey": PK,
            "RowKey": keys.event_row(EVENT),
            "HandoffSeen": False,
            "HistoryCount": ops[2][1]["HistoryCount"],
            "RequestEnqueuedAt": T0 - timedelta(seconds=5),
        },
        '"e3"',
    )
    assert ops[2][1]["HistoryCount"].value == 2 and len(ops) == 3


def test_a_retry_request_is_audited_by_the_manager_in_the_same_transaction() -> None:
    failed = stored(applied(message(MessageType.ErrorResponse, "m-err")))
    m = message(MessageType.RetryRequest, "m-retry", at=5)

    ops = plan_projection(PK, m, failed, project(m, failed, now=T0), now=T0)

    audit = ops[-1][1]
    assert ops[-1][0] == "create" and audit["AuditType"] == "Retry" and audit["AuditorName"] == "Manager"
    assert audit["Data"] == "RetryRequest m-retry" and audit["PartitionKey"] == PK
    assert str(audit["RowKey"]).startswith(keys.audit_row(EVENT, T0, ""))


def test_a_row_read_without_an_etag_is_replaced_if_match_any() -> None:
    request = applied(message(MessageType.EventRequest, "m-request"))  # no ETag
    m = message(MessageType.ErrorResponse, "m-err", at=5)

    ops = plan_projection(PK, m, request, project(m, request, now=T0), now=T0)

    assert ops[1] == tx.replace(ops[1][1], "*")


def test_a_park_written_before_the_lookup_index_served_jobs_has_its_job_row_deleted_and_none_written() -> (
    None
):
    first = applied(message(MessageType.PendingHandoffResponse, "m-park-1", external_job_id="job-1"))
    legacy = stored(first.model_copy(update={"job_key": "jb|job-1|" + EVENT}))
    again = message(MessageType.PendingHandoffResponse, "m-park-2", external_job_id="job-2")  # same time

    decision = project(again, legacy, now=T0)
    ops = plan_projection(PK, again, legacy, decision, now=T0)

    assert decision.row is not None and decision.row.queue_key == legacy.queue_key
    assert decision.row.job_key is None
    written = [(op[0], op[1]["RowKey"]) for op in ops]
    assert ("delete", "jb|job-1|" + EVENT) in written
    assert not any(str(key).startswith("jb|") for kind, key in written if kind != "delete")
    assert all(key != legacy.queue_key for _, key in written)  # the queue row stays (it may hold a lease)


def test_a_park_writes_no_expiry_row_and_its_queue_row_carries_expected_by() -> None:
    request = stored(applied(message(MessageType.EventRequest, "m-request")))
    expected_by = T0 + timedelta(hours=1)
    m = message(MessageType.PendingHandoffResponse, "m-park", at=5, expected_by=expected_by)
    decision = project(m, request, now=T0)
    assert decision.row is not None

    ops = plan_projection(PK, m, request, decision, now=T0)

    assert not any(str(op[1]["RowKey"]).startswith("ex|") for op in ops)
    [queue] = [op for op in ops if op[1]["RowKey"] == decision.row.queue_key]
    assert queue[0] == "create" and queue[1]["ExpectedBy"] == expected_by
    assert QueueRow.model_validate(queue[1]).expected_by == expected_by
    # A park without ExpectedBy: the queue row has no such column, so no filter on it ever matches
    bare = message(MessageType.PendingHandoffResponse, "m-park", at=5)
    bare_ops = plan_projection(PK, bare, request, project(bare, request, now=T0), now=T0)
    assert not any(str(op[1]["RowKey"]).startswith("ex|") for op in bare_ops)
    assert all("ExpectedBy" not in op[1] for op in bare_ops if str(op[1]["RowKey"]).startswith("hq|"))


def legacy_park(expected_by: datetime) -> EventRow:
    """A park as projected before ADR-0022 change 5: its expiry row's key on the event row."""
    first = applied(message(MessageType.PendingHandoffResponse, "m-park-1", expected_by=expected_by))
    return stored(first.model_copy(update={"expiry_key": keys.expiry_row(expected_by, EVENT)}))


def test_a_park_from_before_has_its_expiry_row_deleted_when_the_park_ends() -> None:
    legacy = legacy_park(T0)
    m = message(MessageType.HandoffCompletedRequest, "m-done", at=5)
    decision = project(m, legacy, now=T0)
    assert decision.row is not None and decision.row.expiry_key is None

    ops = plan_projection(PK, m, legacy, decision, now=T0)

    written = [(op[0], op[1]["RowKey"]) for op in ops]
    assert ("delete", keys.expiry_row(T0, EVENT)) in written and ("delete", legacy.queue_key) in written
    assert not any(str(key).startswith("ex|") for kind, key in written if kind != "delete")


def test_a_park_projected_again_onto_its_queue_row_moves_expected_by_onto_it() -> None:
    # A park from before, parked again by a message of the same instant (the same queue row, which may hold
    # a lease): its expiry row goes and the queue row gets the ExpectedBy, merged
    legacy = legacy_park(T0)
    later = T0 + timedelta(hours=2)
    again = message(MessageType.PendingHandoffResponse, "m-park-2", expected_by=later)
    decision = project(again, legacy, now=T0)
    assert decision.row is not None and decision.row.queue_key == legacy.queue_key

    ops = plan_projection(PK, again, legacy, decision, now=T0)

    written = [(op[0], op[1]["RowKey"]) for op in ops]
    assert ("delete", keys.expiry_row(T0, EVENT)) in written
    merge = tx.merge({"PartitionKey": PK, "RowKey": str(legacy.queue_key), "ExpectedBy": later})
    assert merge in ops and ("create", legacy.queue_key) not in written
    # A park of this layout, parked again the same way: the merge only when ExpectedBy changed
    current = stored(decision.row)
    same = message(MessageType.PendingHandoffResponse, "m-park-3", expected_by=later)
    ops = plan_projection(PK, same, current, project(same, current, now=T0), now=T0)
    assert all(op[1]["RowKey"] != current.queue_key for op in ops)
    moved = message(MessageType.PendingHandoffResponse, "m-park-4", expected_by=T0)
    ops = plan_projection(PK, moved, current, project(moved, current, now=T0), now=T0)
    assert tx.merge({"PartitionKey": PK, "RowKey": str(current.queue_key), "ExpectedBy": T0}) in ops


def test_no_session_index_row_is_planned_for_a_new_event() -> None:
    m = message(MessageType.EventRequest, "m-request")
    decision = project(m, None, now=T0)

    ops = plan_projection(PK, m, None, decision, now=T0)

    assert not any(str(op[1]["RowKey"]).startswith("ss|") for op in ops)


def test_a_listing_row_that_stays_is_replaced_and_a_row_never_counted_is_counted_now() -> None:
    first = stored(applied(message(MessageType.EventRequest, "m-request", at=10)))
    copy = message(MessageType.EventRequest, "m-request-2", at=4)

    ops = plan_projection(PK, copy, first, project(copy, first, now=T0), now=T0)
    [key] = first.listing_keys
    assert ("update", key) in [(op[0], op[1]["RowKey"]) for op in ops]
    assert next(op for op in ops if op[1]["RowKey"] == key)[2]["etag"] == "*"
    assert not any(str(op[1]["RowKey"]).startswith("ct|d|") for op in ops)  # same buckets: no delta

    uncounted = first.model_copy(update={"counted": False})
    ops = plan_projection(PK, copy, uncounted, project(copy, uncounted, now=T0), now=T0)
    kinds = {str(op[1]["RowKey"]): op[0] for op in ops}
    assert kinds[key] == "create"  # nothing was listed: inserted
    assert not any(str(op[1]["RowKey"]).startswith("ct|d|") for op in ops)  # Pending is read from rows

    done = message(MessageType.ResolutionResponse, "m-done", at=20)
    ops = plan_projection(PK, done, uncounted, project(done, uncounted, now=T0), now=T0)
    delta = [op[1] for op in ops if str(op[1]["RowKey"]).startswith("ct|d|")]
    assert len(delta) == 1 and delta[0][counts.column("Completed")] == 1
    assert counts.column("Pending") not in delta[0]


def listed_reason(m: InboundMessage) -> object:
    """The ``Reason`` of the listing row the first message ``m`` writes."""
    decision = project(m, None, now=T0)
    assert decision.row is not None
    ops = plan_projection(PK, m, None, decision, now=T0)
    [key] = decision.row.listing_keys
    return next(op[1] for op in ops if op[1]["RowKey"] == key)["Reason"]


def test_a_listing_row_shows_the_reason_or_the_error_text_cut_to_300_characters() -> None:
    def failed(text: str) -> InboundMessage:
        body = json.dumps({"EventContent": None, "ErrorContent": {"ErrorText": text}})
        return message(MessageType.ErrorResponse, "m-err", body_text=body)

    assert listed_reason(failed("e" * 400)) == "e" * 299 + "…"
    assert listed_reason(failed("e" * 300)) == "e" * 300
    dead = message(MessageType.ErrorResponse, "m-dead", dead_letter_error_description="too many tries")
    assert listed_reason(dead) == "too many tries"


def test_error_text_reads_the_error_text_of_a_stored_body() -> None:
    from handoff.projection.rules import error_text

    assert error_text(json.dumps({"ErrorContent": {"ErrorText": "boom"}})) == "boom"
    assert error_text(json.dumps({"ErrorContent": None})) is None
    assert error_text(None) is None


def test_a_park_listed_before_adr_0022_has_its_all_events_hand_off_and_since_rows_deleted_when_it_ends() -> (
    None
):
    # Given a park as the layout before ADR-0022 wrote it: listed under all events, Pending and
    # PendingHandoff, with an oldest-first row, and counted in Pending and PendingHandoff
    park = applied(message(MessageType.PendingHandoffResponse, "m-park"))
    old_keys = [
        keys.all_events_row(T0, EVENT),
        keys.bucket_row("Pending", T0, EVENT),
        keys.bucket_row(counts.PENDING_HANDOFF, T0, EVENT),
    ]
    since = keys.since_row(counts.PENDING_GROUP, T0, EVENT)
    legacy = stored(
        park.model_copy(
            update={"all_key": old_keys[0], "bucket_keys": "\n".join(old_keys[1:]), "since_key": since}
        )
    )
    m = message(MessageType.ResolutionResponse, "m-done", at=5)
    later = T0 + timedelta(seconds=5)

    # When it ends
    decision = project(m, legacy, now=later)
    ops = plan_projection(PK, m, legacy, decision, now=later)

    # Then every old row goes in the event row's transaction, one listing row is written, and the
    # delta counts only the tallied bucket
    written = [(op[0], str(op[1]["RowKey"])) for op in ops]
    assert all(("delete", key) in written for key in [*old_keys, since])
    assert decision.row is not None and decision.row.listing_keys == [
        keys.bucket_row("Completed", later, EVENT)
    ]
    assert ("create", decision.row.listing_keys[0]) in written
    [delta] = [op[1] for op in ops if str(op[1]["RowKey"]).startswith("ct|d|")]
    assert {k: v for k, v in delta.items() if k.startswith("N")} == {counts.column("Completed"): 1}
