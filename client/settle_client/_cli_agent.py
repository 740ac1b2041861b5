"""The ``settle`` commands of an agent: take a parked hand-off (leased or not), renew or release its lease,
and settle it with its lease token (:mod:`settle_client.cli`).
"""

from __future__ import annotations

from settle_client import _cli_output as out
from settle_client._cli_commands import json_arg
from settle_client._cli_context import OK, Context, not_found
from settle_client.models import Coordinates


def cmd_handoffs(ctx: Context) -> int:
    args = ctx.args
    if args.leased:
        handoff = ctx.client.handoffs.receive(
            args.endpoint, args.event_type, args.wait, lease_seconds=args.lease
        )
    else:
        handoff = ctx.client.handoffs.next(args.endpoint, args.event_type, args.wait)
    if handoff is None:
        raise not_found(f"a parked hand-off on {args.endpoint!r} (none free)")
    lease = handoff.lease
    ctx.emit(
        handoff,
        lambda: out.fields(
            [
                ("endpoint", handoff.endpoint_id),
                ("event", handoff.coordinates.event_id),
                ("event type", handoff.event_type_id),
                ("message", handoff.coordinates.message_id),
                ("session", handoff.coordinates.session_id),
                ("external job", handoff.external_job_id),
                ("hand-off reason", handoff.handoff_reason),
                ("expected by", handoff.expected_by),
                ("parked", handoff.parked_at),
                ("lease token", lease.token if lease else None),
                ("lease until", lease.expires_at if lease else None),
                ("leased by", lease.leased_by if lease else None),
                ("payload", handoff.payload),
            ]
        ),
    )
    return OK


def cmd_lease(ctx: Context) -> int:
    """Renew or release the lease ``--lease-token`` holds (a receive from another shell or process)."""
    a = ctx.args
    if a.lease_command == "renew":
        call = ctx.client.handoffs.requests.renew_lease(
            a.endpoint, a.event_id, a.lease_token, lease_seconds=a.lease
        )
    else:
        call = ctx.client.handoffs.requests.release_lease(a.endpoint, a.event_id, a.lease_token)
    answer = ctx.act(call, f"{a.lease_command} the lease on {a.event_id!r} at {a.endpoint!r}")
    ctx.emit(answer, lambda: out.fields([(k, v) for k, v in answer.items()]) or f"{a.lease_command}d")
    return OK


def cmd_settle_leased(ctx: Context) -> int:
    """Complete or fail a leased hand-off with its lease token (fenced: refused once another agent
    leased it)."""
    a = ctx.args
    result = json_arg(a.result, "--result") if getattr(a, "result", None) is not None else None
    event = ctx.client.events.get(a.endpoint, a.event_id)
    if event is None:
        raise not_found(f"event {a.event_id!r} on endpoint {a.endpoint!r}")
    coordinates = Coordinates(
        event_id=event.event_id,
        session_id=event.session_id,
        message_id=event.last_message_id,
        event_type_id=event.event_type_id,
        correlation_id=event.correlation_id,
    )
    requests = ctx.client.handoffs.requests
    if a.settle_command == "complete":
        call = requests.complete(
            a.endpoint, coordinates, result=result, settled_by=ctx.by, lease_token=a.lease_token
        )
    else:
        call = requests.fail(
            a.endpoint,
            coordinates,
            a.error,
            error_type=a.error_type,
            settled_by=ctx.by,
            lease_token=a.lease_token,
        )
    done = ctx.act(call, f"{a.settle_command} the hand-off {a.event_id!r} on {a.endpoint!r}")
    ctx.emit(
        done,
        lambda: out.fields(
            [
                ("settled", a.settle_command),
                ("event", a.event_id),
                ("control message", done.control_message_id),
                ("state", done.state),
                ("confirmed", done.confirmed),
                ("replayed", done.replayed),
            ]
        ),
    )
    return OK
