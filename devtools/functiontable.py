"""The function table: the functions the worker accepted, classified by trigger from their raw bindings."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from devtools.indexing import IndexedFunction
from devtools.routing import RouteTemplate

log = logging.getLogger("settle.devhost")


@dataclass
class HttpFunction:
    name: str
    methods: tuple[str, ...]  # empty: every method
    auth_level: str  # anonymous | function | admin
    route: RouteTemplate
    arg_name: str
    user_function: Callable[..., Any]


@dataclass
class TimerFunction:
    name: str
    schedule_expression: str
    run_on_startup: bool
    arg_name: str
    user_function: Callable[..., Any]


@dataclass
class ServiceBusFunction:
    name: str
    arg_name: str
    user_function: Callable[..., Any]
    binding: dict[str, Any] = field(default_factory=dict)


@dataclass
class FunctionTable:
    http: list[HttpFunction]
    timers: dict[str, TimerFunction]
    service_bus: dict[str, ServiceBusFunction]
    other: dict[str, str]  # name -> trigger type we cannot host

    @property
    def names(self) -> set[str]:
        return {f.name for f in self.http} | set(self.timers) | set(self.service_bus) | set(self.other)


def _disabled(name: str, environ: Mapping[str, str]) -> bool:
    return environ.get(f"AzureWebJobs.{name}.Disabled", "").strip().lower() in {"1", "true"}


def build_function_table(
    functions: Iterable[IndexedFunction], prefix: str, environ: Mapping[str, str] | None = None
) -> FunctionTable:
    """Classify the functions the worker accepted by trigger, from the raw bindings it sends the host."""
    env = os.environ if environ is None else environ
    table = FunctionTable(http=[], timers={}, service_bus={}, other={})
    for fn in functions:
        name = fn.name
        if _disabled(name, env):
            log.info("function %s is disabled by AzureWebJobs.%s.Disabled", name, name)
            continue
        trigger = fn.trigger
        kind = fn.trigger_type
        arg_name = str(trigger["name"])
        if kind == "httpTrigger":
            methods = tuple(str(m).upper() for m in (trigger.get("methods") or ()))
            route = RouteTemplate.compile(str(trigger.get("route") or name), prefix)
            auth = str(trigger.get("authLevel") or "function").lower()
            table.http.append(HttpFunction(name, methods, auth, route, arg_name, fn.user_function))
        elif kind == "timerTrigger":
            table.timers[name] = TimerFunction(
                name, str(trigger["schedule"]), bool(trigger.get("runOnStartup")), arg_name, fn.user_function
            )
        elif kind == "serviceBusTrigger":
            binding = {k: v for k, v in trigger.items() if v is not None}
            table.service_bus[name] = ServiceBusFunction(name, arg_name, fn.user_function, binding)
        else:
            table.other[name] = kind
    # Literal routes win over parameterised ones (as in ASP.NET routing): fewer parameters first.
    table.http.sort(key=lambda f: (len(f.route.parameters), -len(f.route.template)))
    return table
