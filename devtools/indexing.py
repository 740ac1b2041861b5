"""The function app as the Python worker indexes it, by the worker's own code (a development tool).

Before a deployed host serves anything it asks the Python worker for the app's function metadata. The
worker imports ``function_app.py``, takes the functions of its ``FunctionApp`` and validates each one
(``azure_functions_runtime.loader.process_indexed_function``: binding directions, the parameters and the
return annotation against the bindings, ``typing.get_type_hints``). A function it rejects is never
served, whatever a local run did. This module runs that same code, so the development host, the tests
and the infra checks all read what the host will read: each function's raw bindings (route, methods,
auth level, schedule, topic, subscription, connection), exactly as the worker sends them to the host.

``azure-functions-runtime`` is the runtime of Python 3.13 and later, pinned in ``requirements.txt``: Azure
runs the app on exactly that runtime, and this module runs its code.

The runtime is imported inside the function that runs it, so importing this module (the development host, the
tests) does not load it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from azure.functions import FunctionRegister
from azure.functions.decorators.core import BindingDirection, DataType

ROOT = Path(__file__).resolve().parent.parent
APP_SCRIPT = ROOT / "function_app.py"


@dataclass(frozen=True)
class IndexedFunction:
    """One function the worker accepted, with the bindings it reports to the host."""

    name: str
    bindings: tuple[Mapping[str, Any], ...]
    user_function: Callable[..., Any]
    sdk_function: Any  # the azure.functions ``Function`` the worker indexed

    @property
    def trigger(self) -> Mapping[str, Any]:
        return next(b for b in self.bindings if str(b.get("type", "")).endswith("Trigger"))

    @property
    def trigger_type(self) -> str:
        return str(self.trigger["type"])


class IndexingFailed(Exception):
    """The worker rejected functions: the deployed host would log "Worker failed to index functions"."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        lines = "\n".join(f"  {name}: {reason}" for name, reason in sorted(self.failures.items()))
        super().__init__(f"the Python worker rejects {len(self.failures)} function(s):\n{lines}")


def _protos() -> Any:
    """The part of the host's gRPC module (``FunctionRpc.proto``) that indexing reads.

    The worker compares a binding's direction and data type with ``BindingInfo``'s enum values and builds
    ``BindingInfo`` / ``RpcFunctionMetadata`` / ``RpcRetryOptions`` messages it hands to the host. The enum
    values are the SDK's own (``BindingDirection``, ``DataType``: the numbers the contract defines); the
    messages are plain records, since nothing here serialises them.
    """

    class Message:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    binding_info: Any = type(
        "BindingInfo",
        (Message,),
        {
            "in": BindingDirection.IN.value,
            "out": BindingDirection.OUT.value,
            "inout": BindingDirection.INOUT.value,
            "undefined": DataType.UNDEFINED.value,
            "string": DataType.STRING.value,
            "binary": DataType.BINARY.value,
            "stream": DataType.STREAM.value,
        },
    )
    return types.SimpleNamespace(
        BindingInfo=binding_info, RpcFunctionMetadata=Message, RpcRetryOptions=Message
    )


def _runtime() -> tuple[Any, Any, Any]:
    try:
        from azure_functions_runtime import loader
        from azure_functions_runtime.bindings import meta
        from azure_functions_runtime.functions import Registry
    except ImportError as exc:  # pragma: no cover - a missing dev dependency, said plainly
        raise RuntimeError(
            "azure-functions-runtime (the Python worker's own code) is not installed: run `make install`"
        ) from exc
    return loader, meta, Registry


def forget_indexing(script: Path = APP_SCRIPT) -> None:
    """Let the app of ``script`` be indexed again in this process, as in a fresh worker process.

    ``FunctionApp.get_functions()`` records the names it has seen to refuse duplicates, so a second
    indexing of the same app object (the tests' index, then the runtime's own worker init) would refuse
    every function as a duplicate. A worker process indexes once; forgetting the record makes the next
    indexing see the app as that process would. Nothing else of the app changes.
    """

    module = sys.modules.get(script.stem)
    for value in vars(module).values() if module is not None else ():
        if isinstance(value, FunctionRegister) and hasattr(value, "functions_bindings"):
            value.functions_bindings = None


@cache
def index(script: Path = APP_SCRIPT) -> tuple[IndexedFunction, ...]:
    """Index the app in ``script`` as the worker does; raise :class:`IndexingFailed` listing every rejection.

    Cached per process: ``FunctionApp.get_functions()`` may run only once per app object. The worker
    imports the script by its file name, so its folder goes on ``sys.path`` (the host's working directory).
    """
    loader, meta, registry = _runtime()
    folder = str(script.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    meta.load_binding_registry()  # the worker's init step, before any indexing
    forget_indexing(script)
    protos = _protos()
    accepted: list[IndexedFunction] = []
    failures: dict[str, str] = {}
    for function in loader.index_function_app(str(script)):
        name = str(function.get_function_name())
        try:
            loader.process_indexed_function(protos, registry(), [function], folder)
        except Exception as exc:  # the worker's FunctionLoadError, NameError from get_type_hints, ...
            failures[name] = f"{type(exc).__name__}: {exc}"
            continue
        bindings = tuple(json.loads(raw) for raw in function.get_raw_bindings())
        accepted.append(IndexedFunction(name, bindings, function.get_user_function(), function))
    if failures:
        raise IndexingFailed(failures)
    return tuple(accepted)


def script_of(module: str) -> Path:
    """The file of an importable module (``function_app``, ``tests.devhost.sample_app``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    return Path(spec.origin).resolve()


def index_module(module: str) -> tuple[IndexedFunction, ...]:
    """Index the app of an importable module (``function_app``, ``tests.devhost.sample_app``)."""
    return index(script_of(module))
