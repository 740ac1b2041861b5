"""The host's side of the host/worker contract, driving the pinned Python runtime in this process.

The development host invokes every function through it, and the worker conformance suite
(``tests/worker``) checks the app through it: a request served locally takes the runtime's own path, as it
does in Azure. ``function_rpc.proto`` (our own definitions of the published contract's messages) is
compiled with grpcio-tools (a development dependency) into a temporary folder, and its module is handed to
``azure_functions_runtime`` as the host's ``protos``, as the proxy worker does. :class:`Worker` then
sends what the Functions host sends, in its order: ``WorkerInitRequest`` (the runtime indexes the app),
``FunctionsMetadataRequest``, one ``FunctionLoadRequest`` per function, and ``InvocationRequest``
messages shaped as the host shapes them:

* HTTP as the host builds ``RpcHttp``: lower-case header names, the body as bytes, route values taken from
  the path decoded once (the host decodes the path, ``%2F`` included, before it matches routes), the query
  with repeated values joined by ``,``.
* Service Bus as the extension fills the trigger metadata: ``MessageId``, ``SessionId``, ``CorrelationId``
  and the like as strings, ``DeliveryCount`` and ``SequenceNumber`` as JSON numbers, ``EnqueuedTimeUtc`` as a
  JSON date without a zone, ``ApplicationProperties`` / ``UserProperties`` as JSON.
* Timers as the host's JSON (``Schedule``, ``ScheduleStatus``, ``IsPastDue``).

Every invocation carries the host's W3C context in ``trace_context``.

grpcio-tools (a development dependency) and the worker runtime are imported inside the functions that use
them, so importing this module does not load them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import threading
import types
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from devtools import indexing
from devtools.routing import RouteTemplate, decode_path

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path(__file__).with_name("function_rpc.proto")
HOST_VERSION = "4.1045.100.0"
# What the host announces in WorkerInitRequest.capabilities (the runtime reads the data cache flag).
HOST_CAPABILITIES = {"FunctionDataCache": "false"}


@cache
def protos() -> types.ModuleType:
    """Our ``function_rpc.proto``, compiled now with grpcio-tools and imported (once per process)."""
    import grpc_tools  # type: ignore[import-untyped]
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="settle-rpc-"))
    include = Path(grpc_tools.__file__).parent / "_proto"  # google/protobuf/*.proto
    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={out}", str(PROTO)])
    if status != 0:
        raise RuntimeError(f"protoc failed ({status}) on {PROTO}")
    spec = importlib.util.spec_from_file_location("settle_function_rpc_pb2", out / "function_rpc_pb2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Json:
    """A metadata value already serialised as JSON (a ``DateTime`` as the extension writes it)."""

    text: str


def typed(value: Any) -> Any:
    """A ``TypedData`` as the host encodes a metadata value: text as ``string``, bytes as ``bytes``, and
    everything else (numbers, dates, dictionaries) as ``json``: the runtime reads no ``int`` metadata."""
    pb = protos()
    if isinstance(value, Json):
        return pb.TypedData(json=value.text)
    if isinstance(value, str):
        return pb.TypedData(string=value)
    if isinstance(value, bytes):
        return pb.TypedData(bytes=value)
    return pb.TypedData(json=json.dumps(value, default=str))


def host_datetime(moment: datetime) -> str:
    """A UTC time as the Service Bus extension serialises a ``DateTime``: JSON, seven decimals, no zone."""
    utc = moment.astimezone(UTC).replace(tzinfo=None)
    return json.dumps(utc.strftime("%Y-%m-%dT%H:%M:%S.%f") + "0")


@dataclass(frozen=True)
class Answer:
    """An ``InvocationResponse`` read back: the status, and the HTTP answer when there is one."""

    response: Any

    @property
    def succeeded(self) -> bool:
        pb = protos()
        return bool(self.response.result.status == pb.StatusResult.Success)

    @property
    def error(self) -> str:
        return str(self.response.result.exception.message)

    @property
    def http(self) -> Any:
        value = self.response.return_value
        assert value.WhichOneof("data") == "http", value
        return value.http

    @property
    def status(self) -> int:
        return int(self.http.status_code)

    @property
    def headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.http.headers.items()}

    @property
    def body(self) -> bytes:
        body = self.http.body
        kind = body.WhichOneof("data")
        if kind is None:
            return b""
        value = getattr(body, kind)
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Worker:
    """The pinned runtime's handlers, called as the proxy worker calls them for the host's messages."""

    def __init__(self, script: Path = ROOT / "function_app.py", *, prefix: str = "api") -> None:
        from azure_functions_runtime import handle_event

        self.events = handle_event
        self.script = script
        self.directory = script.parent
        self.prefix = prefix
        # The runtime's handlers run on one event loop, as in the worker; callers may be any thread.
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="runtime-loop", daemon=True)
        self._thread.start()
        self.metadata: dict[str, Any] = {}  # function name -> RpcFunctionMetadata
        self.routes: dict[str, RouteTemplate] = {}

    def _send(self, handler: Any, **content: Any) -> Any:
        message = protos().StreamingMessage(request_id=uuid.uuid4().hex, **content)
        envelope = types.SimpleNamespace(
            request=message, properties={"host": "127.0.0.1", "protos": protos()}
        )
        return asyncio.run_coroutine_threadsafe(handler(envelope), self.loop).result()

    def start(self) -> Any:
        """Init (the runtime indexes the app), then metadata and one load per function, as the host does.
        Returns the ``WorkerInitResponse``."""
        from azure_functions_runtime import start_threadpool_executor

        pb = protos()
        if self.script.name != "function_app.py":  # the app setting the worker reads for another script
            os.environ["PYTHON_SCRIPT_FILE_NAME"] = self.script.name
        indexing.forget_indexing(self.script)
        start_threadpool_executor()
        init = self._send(
            self.events.worker_init_request,
            worker_init_request=pb.WorkerInitRequest(
                host_version=HOST_VERSION,
                capabilities=HOST_CAPABILITIES,
                worker_directory=str(self.directory),
                function_app_directory=str(self.directory),
            ),
        )
        if init.result.status != pb.StatusResult.Success:
            return init
        listed = self._send(
            self.events.functions_metadata_request,
            functions_metadata_request=pb.FunctionsMetadataRequest(
                function_app_directory=str(self.directory)
            ),
        )
        # The runtime hands back its own protos' messages; the host reads them off the wire.
        for metadata in listed.function_metadata_results:
            wire = pb.RpcFunctionMetadata.FromString(metadata.SerializeToString())
            self.metadata[wire.name] = wire
        return init

    def start_and_load(self) -> dict[str, str]:
        """:meth:`start`, then :meth:`load` every function; the failures by function (empty: all served)."""
        pb = protos()
        init = self.start()
        if init.result.status != pb.StatusResult.Success:
            return {"(worker init)": str(init.result.exception.message)}
        failures = {}
        for name in self.metadata:
            loaded = self.load(name)
            if loaded.result.status != pb.StatusResult.Success:
                failures[name] = str(loaded.result.exception.message)
        return failures

    def load(self, name: str) -> Any:
        pb = protos()
        metadata = self.metadata[name]
        return self._send(
            self.events.function_load_request,
            function_load_request=pb.FunctionLoadRequest(function_id=metadata.function_id, metadata=metadata),
        )

    def bindings(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.metadata[name].raw_bindings]

    def trigger(self, name: str) -> dict[str, Any]:
        return next(b for b in self.bindings(name) if str(b["type"]).endswith("Trigger"))

    def invoke(
        self,
        name: str,
        data: Any,
        *,
        trigger_metadata: Mapping[str, Any] | None = None,
        traceparent: str | None = None,
        tracestate: str = "",
    ) -> Answer:
        """One ``InvocationRequest`` for function ``name`` with its trigger's ``TypedData``."""
        pb = protos()
        trigger = self.trigger(name)
        parent = traceparent or f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
        request = pb.InvocationRequest(
            invocation_id=str(uuid.uuid4()),
            function_id=self.metadata[name].function_id,
            input_data=[pb.ParameterBinding(name=trigger["name"], data=data)],
            trigger_metadata={k: typed(v) for k, v in (trigger_metadata or {}).items()},
            trace_context=pb.RpcTraceContext(
                trace_parent=parent, trace_state=tracestate, attributes={"OperationName": name}
            ),
            retry_context=pb.RetryContext(retry_count=0, max_retry_count=0),
        )
        # On the wire and back, as the host's bytes reach the worker.
        request = pb.InvocationRequest.FromString(request.SerializeToString())
        response = self._send(self.events.invocation_request, invocation_request=request)
        return Answer(pb.InvocationResponse.FromString(response.SerializeToString()))

    # -- the host's payloads ---------------------------------------------------------------------------

    def http(
        self,
        name: str,
        method: str,
        target: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        json_body: Any = None,
        base: str = "https://settle.azurewebsites.net",
        traceparent: str | None = None,
        tracestate: str = "",
        params: Mapping[str, str] | None = None,
    ) -> Answer:
        """Invoke HTTP function ``name`` for ``method target`` (path and query as on the request line)."""
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
        sent = {k.lower(): v for k, v in (headers or {}).items()}
        if body is not None:
            if json_body is not None:
                sent.setdefault("content-type", "application/json")
            sent["content-length"] = str(len(body))
        parts = urlsplit(target)
        if params is None:  # route values from the path decoded once, as the host takes them
            params = self.route(name).match(decode_path(parts.path))
            if params is None:
                raise ValueError(f"{target} is not routed to {name} ({self.route(name).template})")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            query[key] = f"{query[key]},{value}" if key in query else value
        return self.http_rpc(
            name,
            method,
            base + target,
            headers=sent,
            query=query,
            params=params,
            body=body or b"",
            traceparent=traceparent,
            tracestate=tracestate,
        )

    def http_rpc(
        self,
        name: str,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        params: Mapping[str, str],
        body: bytes,
        traceparent: str | None = None,
        tracestate: str = "",
    ) -> Answer:
        """Invoke HTTP function ``name`` with the ``RpcHttp`` the host builds from a routed request."""
        pb = protos()
        sent = {k.lower(): v for k, v in headers.items()}
        rpc = pb.RpcHttp(
            method=method,
            url=url,
            headers=sent,
            body=pb.TypedData(bytes=body),
            params=dict(params),
            query=dict(query),
            nullable_headers={k: pb.NullableString(value=v) for k, v in sent.items()},
            nullable_params={k: pb.NullableString(value=v) for k, v in params.items()},
            nullable_query={k: pb.NullableString(value=v) for k, v in query.items()},
        )
        return self.invoke(name, pb.TypedData(http=rpc), traceparent=traceparent, tracestate=tracestate)

    def route(self, name: str) -> RouteTemplate:
        if name not in self.routes:
            self.routes[name] = RouteTemplate.compile(str(self.trigger(name)["route"]), self.prefix)
        return self.routes[name]

    def service_bus(
        self,
        name: str,
        message: Any,
        *,
        traceparent: str | None = None,
        tracestate: str = "",
        lock_token: str | None = None,
    ) -> Answer:
        """Invoke a Service Bus trigger with ``message`` (an ``azure.functions.ServiceBusMessage`` as the
        tests build one) sent as the extension sends it: the body as bytes, the rest as trigger metadata."""
        pb = protos()
        enqueued = message.enqueued_time_utc or datetime.now(UTC)
        properties = dict(message.application_properties or {})
        metadata: dict[str, Any] = {
            "MessageId": message.message_id,
            "DeliveryCount": message.delivery_count or 1,
            "SequenceNumber": message.sequence_number or 1,
            "EnqueuedTimeUtc": Json(host_datetime(enqueued)),
            "ExpiresAtUtc": Json(host_datetime(enqueued + timedelta(days=14))),
            "LockedUntil": Json(host_datetime(datetime.now(UTC) + timedelta(seconds=30))),
            "LockToken": lock_token or str(uuid.uuid4()),
            "ApplicationProperties": properties,
            "UserProperties": properties,
        }
        for key, value in {
            "SessionId": message.session_id,
            "CorrelationId": message.correlation_id,
            "ContentType": message.content_type,
            "Subject": message.subject,
            "Label": message.label,
            "To": message.to,
            "ReplyTo": message.reply_to,
        }.items():
            if value:
                metadata[key] = value
        metadata["sys"] = {
            "MethodName": name,
            "UtcNow": datetime.now(UTC).isoformat(),
            "RandGuid": str(uuid.uuid4()),
        }
        return self.invoke(
            name,
            pb.TypedData(bytes=message.get_body()),
            trigger_metadata=metadata,
            traceparent=traceparent,
            tracestate=tracestate,
        )

    def timer(self, name: str, *, past_due: bool = False, traceparent: str | None = None) -> Answer:
        """Invoke a timer with the host's ``TimerInfo`` JSON."""
        pb = protos()
        now = datetime.now(UTC)
        info = {
            "Schedule": {"AdjustForDST": True},
            "ScheduleStatus": {
                "Last": (now - timedelta(minutes=5)).isoformat(),
                "Next": (now + timedelta(minutes=5)).isoformat(),
                "LastUpdated": now.isoformat(),
            },
            "IsPastDue": past_due,
        }
        return self.invoke(name, pb.TypedData(json=json.dumps(info)), traceparent=traceparent)

    def close(self) -> None:
        from azure_functions_runtime import stop_threadpool_executor

        stop_threadpool_executor()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()
