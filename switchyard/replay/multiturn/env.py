"""The environment of a multi-turn case: BFCL's own Python classes (a file system, trading,
travel, messaging, ...), loaded from the wheel's eval_checker/multi_turn_eval/func_source_code/
into a private module namespace (`_switchyard_bfcl_env`, so nothing named bfcl_eval is imported
and the wheel is never installed), one instance per class, loaded with the case's initial state.

Calls run as BFCL runs them: a method of whichever involved instance has that name (the later
class wins, as in BFCL's name map), the result turned into a string as BFCL does (str as is, dict
as JSON, else str()), an exception as "Error during execution: ...". What differs on purpose:
BFCL builds a Python string and eval()s it; here the call is a name and literal arguments, so a
model cannot run code through a tool name.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import sys
import threading
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = "_switchyard_bfcl_env"
_WHEEL_PREFIX = "bfcl_eval/eval_checker/multi_turn_eval/func_source_code/"
_IMPORT_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
MODULES = {  # BFCL's CLASS_FILE_PATH_MAPPING, for the classes of the multi-turn suites
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = frozenset({"MathAPI"})
# BFCL refuses these method names before it runs a call.
BLOCKED = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
_lock = threading.Lock()


class EnvError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, kwargs: dict[str, Any]) -> Call:
        return cls(name, (), tuple(kwargs.items()))

    def text(self) -> str:
        """The call as BFCL writes a decoded model call: name(k=repr(v),...)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.name}({','.join(parts)})"


def parse_call(text: str) -> Call:
    """A ground-truth call string (`cd(folder='x')`, `sort('a.pdf')`) -> a Call. Literals only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a plain call")
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = tuple((str(k.arg), ast.literal_eval(k.value)) for k in node.keywords)
    except (SyntaxError, ValueError) as e:
        raise EnvError(f"not a call of literals: {text!r} ({e})") from None
    return Call(node.func.id, args, kwargs)


def _wheel() -> zipfile.ZipFile:
    from switchyard.datasets import bfcl_zip

    return bfcl_zip()


def load_modules(wheel: zipfile.ZipFile | None = None) -> dict[str, type]:
    """class name -> class, from the wheel's sources, each module once per process."""
    with _lock:
        if PACKAGE not in sys.modules:
            z = wheel or _wheel()
            pkg = types.ModuleType(PACKAGE)
            pkg.__path__ = []
            sys.modules[PACKAGE] = pkg
            # long_context first: the others import from it.
            for mod in ["long_context", *dict.fromkeys(MODULES.values())]:
                member = f"{_WHEEL_PREFIX}{mod}.py"
                src = z.read(member).decode("utf-8").replace(_IMPORT_PREFIX, PACKAGE)
                m = types.ModuleType(f"{PACKAGE}.{mod}")
                m.__file__ = f"{Path(z.filename or 'bfcl-eval.whl').name}/{member}"
                sys.modules[m.__name__] = m
                try:
                    exec(compile(src, m.__file__, "exec"), m.__dict__)  # noqa: S102 - the wheel's own code
                except Exception:
                    del sys.modules[m.__name__]
                    del sys.modules[PACKAGE]
                    raise
                setattr(pkg, mod, m)
        return {cls: getattr(sys.modules[f"{PACKAGE}.{mod}"], cls) for cls, mod in MODULES.items()}


def stringify(result: Any) -> str:
    """A method's return value as BFCL feeds it back."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


class Environment:
    """The instances of one case's classes, in their initial state."""

    def __init__(self, involved_classes: list[str], initial_config: dict[str, Any], long_context: bool = False):
        classes = load_modules()
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for name in involved_classes:
            if name not in classes:
                raise EnvError(f"unknown environment class {name!r}")
            inst = classes[name]()
            if name not in STATELESS:
                inst._load_scenario(copy.deepcopy(initial_config.get(name, {})), long_context=long_context)
            self.instances[name] = inst
            for mname, method in inspect.getmembers(inst, predicate=inspect.ismethod):
                if not mname.startswith("_"):
                    self.methods[mname] = method

    def execute(self, calls: list[Call]) -> list[str]:
        return [self.execute_one(c) for c in calls]

    def execute_one(self, call: Call) -> str:
        if call.name in BLOCKED:
            return f"Error during execution: Function call {call.name} is not allowed."
        method = self.methods.get(call.name)
        if method is None:
            return f"Error during execution: name '{call.name}' is not defined"
        # Fresh argument objects each time, as BFCL's eval of the call text makes them: a method
        # may keep a list it is given and change it later (TwitterAPI keeps `mentions`).
        args, kwargs = copy.deepcopy(call.args), copy.deepcopy(dict(call.kwargs))
        try:
            return stringify(method(*args, **kwargs))
        except Exception as e:  # the environment's own errors go back to the model, as in BFCL
            return f"Error during execution: {e}"

    def named_args(self, call: Call) -> dict[str, Any]:
        """The call's arguments by parameter name (for sending a ground-truth call as a tool call)."""
        method = self.methods.get(call.name)
        if method is None or not call.args:
            return dict(call.kwargs)
        return dict(inspect.signature(method).bind(*call.args, **dict(call.kwargs)).arguments)

    def state(self) -> dict[str, dict[str, Any]]:
        """Each instance's public attributes: what BFCL's state check compares."""
        return {name: {k: v for k, v in vars(inst).items() if not k.startswith("_")}
                for name, inst in self.instances.items()}
