"""A tiny function app for the development host's own tests (not Settle's functions).

Each function records what it received in the folder named by ``DEVHOST_SAMPLE_OUT`` so a test in
another process can see exactly what the development host passed.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)


def _record(kind: str, data: dict[str, Any]) -> None:
    folder = Path(os.environ["DEVHOST_SAMPLE_OUT"])
    (folder / f"{kind}-{uuid.uuid4().hex}.json").write_text(json.dumps(data))


def _echo(req: func.HttpRequest) -> func.HttpResponse:
    document = {
        "method": req.method,
        "url": req.url,
        "params": dict(req.params),
        "routeParams": dict(req.route_params),
        "headers": {k: req.headers[k] for k in ("x-sample", "content-type") if k in req.headers},
        "body": req.get_body().decode("utf-8"),
    }
    return func.HttpResponse(json.dumps(document), mimetype="application/json", headers={"X-Echo": "1"})


@app.route(route="v1/items/{itemId:guid}/{name?}", methods=["GET", "PUT"])
def sample_item(req: func.HttpRequest) -> func.HttpResponse:
    return _echo(req)


@app.route(route="v1/items/special", methods=["GET"])
def sample_special(req: func.HttpRequest) -> func.HttpResponse:
    return func.HttpResponse("special")


@app.route(route="v1/open/{count:int}", methods=["POST"], auth_level=func.AuthLevel.ANONYMOUS)
def sample_open(req: func.HttpRequest) -> func.HttpResponse:
    return _echo(req)


@app.route(route="v1/jobs/{endpointId}/{jobId}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def sample_job(req: func.HttpRequest) -> func.HttpResponse:
    return _echo(req)


@app.route(route="v1/context", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def sample_context(req: func.HttpRequest, context: func.Context) -> func.HttpResponse:
    document = {
        "context": f"{type(context).__module__}.{type(context).__name__}",
        "request": f"{type(req).__module__}.{type(req).__name__}",
        "traceparent": context.trace_context.trace_parent,
        "invocationId": context.invocation_id,
    }
    return func.HttpResponse(json.dumps(document), mimetype="application/json")


@app.route(route="v1/boom", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def sample_boom(req: func.HttpRequest) -> func.HttpResponse:
    raise RuntimeError("the sample function failed on purpose")


@app.timer_trigger(schedule="%SAMPLE_SCHEDULE%", arg_name="timer", run_on_startup=False, use_monitor=False)
def sample_timer(timer: func.TimerRequest) -> None:
    _record("timer", {"pastDue": timer.past_due})


@app.service_bus_topic_trigger(
    arg_name="message",
    topic_name="%RESOLVER_TOPIC%",
    subscription_name="%RESOLVER_SUBSCRIPTION%",
    connection="ServiceBusConnection",
    is_sessions_enabled=True,
)
def sample_bus(message: func.ServiceBusMessage) -> None:
    if message.application_properties.get("Fail") == "yes":
        raise ValueError("poison message")
    _record(
        "bus",
        {
            "body": message.get_body().decode("utf-8"),
            "messageId": message.message_id,
            "sessionId": message.session_id,
            "correlationId": message.correlation_id,
            "applicationProperties": dict(message.application_properties),
            "deliveryCount": message.delivery_count,
            "enqueuedTimeUtc": message.enqueued_time_utc.isoformat() if message.enqueued_time_utc else None,
        },
    )
