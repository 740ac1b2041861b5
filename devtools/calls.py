"""How the development host calls a function: through the pinned Python runtime (as Azure does), or directly.

:class:`RuntimeCalls` sends each invocation to ``azure_functions_runtime`` as the Functions host sends it
(:mod:`devtools.worker`): the runtime builds the ``HttpRequest``, ``ServiceBusMessage`` or ``TimerRequest``
and the ``context`` from the host's messages, runs the function (a sync one in its thread pool) and turns
its return value into the host's ``RpcHttp``. A request served locally takes the path it takes in Azure.
:class:`DirectCalls` calls the Python function itself, for a host built in a test from a function table.

Both raise :class:`FunctionFailed` (or the function's own exception) when the function raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import azure.functions as func
from azure.functions.timer import TimerRequest

from devtools.functiontable import HttpFunction, ServiceBusFunction, TimerFunction
from devtools.invocation import InvocationContext, TraceContext, host_trace, invoke, message_context
from devtools.serving import Answer, from_function_response
from devtools.worker import Worker

log = logging.getLogger("settle.devhost")


class FunctionFailed(Exception):
    """The function raised inside the runtime: ``detail`` is ``Type: message``, as the host reports it."""

    def __init__(self, detail: str, stack_trace: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.stack_trace = stack_trace


@dataclass(frozen=True)
class HttpCall:
    """A routed HTTP request as the host hands it on: lower-case headers, the query with repeated values
    joined by ``,``, the route values from the decoded path, the body, and the host's invocation trace."""

    method: str
    url: str
    headers: Mapping[str, str]
    query: Mapping[str, str]
    route_params: Mapping[str, str]
    body: bytes
    trace: TraceContext


class Calls(Protocol):
    def http(self, fn: HttpFunction, call: HttpCall) -> Answer: ...

    def service_bus(self, fn: ServiceBusFunction, message: Any) -> None: ...

    def timer(self, fn: TimerFunction, *, past_due: bool) -> None: ...


class DirectCalls:
    """Call the user function in this thread with what the worker would build."""

    def http(self, fn: HttpFunction, call: HttpCall) -> Answer:

        request = func.HttpRequest(
            call.method,
            call.url,
            headers=dict(call.headers),
            params=dict(call.query),
            route_params=dict(call.route_params),
            body=call.body,
        )
        response = invoke(fn.user_function, fn.arg_name, request, InvocationContext(fn.name, call.trace))
        return from_function_response(response, fn.name)

    def service_bus(self, fn: ServiceBusFunction, message: Any) -> None:
        invoke(fn.user_function, fn.arg_name, message, message_context(fn.name, message))

    def timer(self, fn: TimerFunction, *, past_due: bool) -> None:

        invoke(
            fn.user_function,
            fn.arg_name,
            TimerRequest(past_due=past_due),
            InvocationContext(fn.name, host_trace()),
        )


class RuntimeCalls:
    """Send each invocation to the pinned runtime as the Functions host does (:mod:`devtools.worker`)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    @staticmethod
    def _checked(answer: Any, name: str) -> Any:
        if not answer.succeeded:
            exception = answer.response.result.exception
            raise FunctionFailed(str(exception.message) or f"{name} failed", str(exception.stack_trace))
        return answer

    def http(self, fn: HttpFunction, call: HttpCall) -> Answer:
        answer = self._checked(
            self.worker.http_rpc(
                fn.name,
                call.method,
                call.url,
                headers=call.headers,
                query=call.query,
                params=call.route_params,
                body=call.body,
                traceparent=call.trace.trace_parent,
                tracestate=call.trace.trace_state,
            ),
            fn.name,
        )
        return Answer(answer.status, list(answer.http.headers.items()), answer.body, fn.name)

    def service_bus(self, fn: ServiceBusFunction, message: Any) -> None:
        context = message_context(fn.name, message).trace_context
        self._checked(
            self.worker.service_bus(
                fn.name, message, traceparent=context.trace_parent, tracestate=context.trace_state
            ),
            fn.name,
        )

    def timer(self, fn: TimerFunction, *, past_due: bool) -> None:
        self._checked(
            self.worker.timer(fn.name, past_due=past_due, traceparent=host_trace().trace_parent), fn.name
        )
