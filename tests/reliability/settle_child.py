"""A settling process for the reliability suite: run as ``python -m tests.reliability.settle_child ARGS``.

It calls the ``handoff_complete`` / ``handoff_fail`` functions of the real app (same tables as the parent,
from the environment) and prints one JSON line per answer. Its transport appends every message it sends
to a shared *topic file* (one JSON line each, under an exclusive lock), which the parent loads into its
broker model: what is in the file is what reached the endpoint topic.

``kill`` (test-only hooks, nothing in the product) sends SIGKILL to the process itself:

* ``claim-applied``: right after the claim transaction's answer arrived (between claim and send);
* ``before-send``: when the send starts (nothing reaches the topic);
* ``after-send``: once the message is in the topic file (between the send and marking the claim sent).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from azure.core.pipeline.policies import HTTPPolicy


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillAfterClaim(HTTPPolicy):  # type: ignore[type-arg]
    """SIGKILL once the first entity-group transaction (the claim) has been applied and answered."""

    def send(self, request: Any) -> Any:
        response = self.next.send(request)
        if request.http_request.method == "POST" and "$batch" in request.http_request.url:
            _die()
        return response


class FileTransport:
    """Appends each sent message to the topic file: the endpoint topic, as far as the test can see."""

    name = "topic-file"

    def __init__(self, path: str, *, kill: str | None, window_s: float | None) -> None:
        self.path = path
        self.kill = kill
        self.duplicate_window = timedelta(seconds=window_s) if window_s is not None else None

    def send(self, topic: str, message: Any) -> None:
        if self.kill == "before-send":
            _die()
        body = b"".join(bytes(part) for part in message.body)
        line = {
            "topic": topic,
            "at": datetime.now(UTC).isoformat(),
            "pid": os.getpid(),
            "messageId": str(message.message_id),
            "sessionId": message.session_id,
            "correlationId": message.correlation_id,
            "properties": {str(k): v for k, v in (message.application_properties or {}).items()},
            "body": base64.b64encode(body).decode("ascii"),
        }
        with open(self.path, "a", encoding="utf-8") as topic_file:
            fcntl.flock(topic_file, fcntl.LOCK_EX)
            topic_file.write(json.dumps(line) + "\n")
            topic_file.flush()
            os.fsync(topic_file.fileno())
            fcntl.flock(topic_file, fcntl.LOCK_UN)
        if self.kill == "after-send":
            _die()


def read_topic_file(path: str | Path) -> list[dict[str, Any]]:
    """The messages the children sent, oldest first, each with a ready ``ServiceBusMessage``."""
    from azure.servicebus import ServiceBusMessage

    out: list[dict[str, Any]] = []
    file = Path(path)
    if not file.exists():
        return out
    for text in file.read_text(encoding="utf-8").splitlines():
        line = json.loads(text)
        line["message"] = ServiceBusMessage(
            base64.b64decode(line["body"]),
            message_id=line["messageId"],
            session_id=line["sessionId"],
            correlation_id=line["correlationId"],
            application_properties=line["properties"],
        )
        line["at"] = datetime.fromisoformat(line["at"])
        out.append(line)
    return out


def main(args: dict[str, Any]) -> None:
    import azure.functions as func

    from common import runtime
    from handoff import service

    kill = args.get("kill")
    runtime.reset(policies=[KillAfterClaim()] if kill == "claim-applied" else [])
    if args.get("transport") == "loopback":
        # The real learning transport: this process's resolver projects what it sends.
        from handoff.messages.transport import LoopbackTransport

        service.use_transport(LoopbackTransport(lambda msg: service.resolver_service().handle(msg)))
    else:
        service.use_transport(FileTransport(args["topic_file"], kill=kill, window_s=args.get("window_s")))
    import function_app

    functions = {str(f.get_function_name()): f for f in function_app.app.get_functions()}
    start_at = float(args.get("start_at") or 0)
    while time.time() < start_at:  # line the processes up, so their requests race
        time.sleep(0.005)
    for request in args["requests"]:
        fn = functions[request["function"]]
        req = func.HttpRequest(
            request.get("method", "POST"),
            f"http://localhost/api/{getattr(fn.get_trigger(), 'route', '')}",
            headers={"content-type": "application/json", **request.get("headers", {})},
            params=request.get("params", {}),
            route_params=request.get("route_params", {}),
            body=json.dumps(request["body"]).encode() if request.get("body") is not None else b"",
        )
        resp = fn.get_user_function()(req)
        body = resp.get_body()
        event_id = (request.get("body") or {}).get("coordinates", {}).get("eventId")
        answer = {
            "eventId": event_id or request.get("route_params", {}).get("eventId"),
            "status": resp.status_code,
        }
        answer["json"] = json.loads(body) if body else None
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
