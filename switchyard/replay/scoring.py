"""BFCL's AST checking rules, written for Switchyard (not BFCL's code).

A model's answer is a list of calls `{name: {param: value}}` (names already mapped back
to the names the expected answers use). The expected answer is BFCL's ground truth: a
list of `{name: {param: [allowed values...]}}`, where `""` among the allowed values
means the parameter may be left out.

The rules follow BFCL's ast_checker:
- the function name must match; every required parameter must be present; a parameter
  that the function does not declare, or that the answer does not list, fails;
- values are type-checked against the declared type (an int is accepted for a float;
  a bool is never an int); when the allowed values have another type than the declared
  one, the value is taken as a "variable" and compared as it is;
- strings are compared after BFCL's normalisation (lowercase; spaces and , . / - _ * ^
  removed; single quotes read as double quotes); lists element-wise (strings in them
  normalised); dicts key by key, one level deep, their optional keys may be missing;
- parallel categories: as many calls as expected, matched in any order; multiple and
  simple categories: exactly one call;
- Java and JavaScript categories: every argument is a string, read as a literal of the
  declared type first (langs.py); no int-for-float leniency there, as in BFCL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from switchyard.replay.langs import JAVA_TYPES, JS_TYPES, convert, render

TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "number": float,  # JSON Schema (JSONL traces): a number is a float that accepts ints
    "boolean": bool,
    "bool": bool,
    "array": list,
    "list": list,
    "tuple": list,
    "dict": dict,
    "object": dict,
    "any": str,
}
_NESTED = ("array", "tuple", "list", "Array", "ArrayList")
_STRIP = re.compile(r"[ ,./\-_*^]")

Call = dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Verdict:
    correct: bool
    error: str = ""


OK = Verdict(True)


def standardize(s: str) -> str:
    return _STRIP.sub("", s).lower().replace("'", '"')


def _std(v: Any) -> Any:
    return standardize(v) if isinstance(v, str) else v


def _answer_type(allowed: list[Any]) -> type | None:
    for a in allowed:
        if a != "":
            return type(a)
    return None


def _type_ok(value: Any, allowed: list[Any], declared: type, nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable). Exact types: bool is not int, as in BFCL."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not declared
    if type(value) is declared:
        if nested is None:
            return True, is_variable
        # One level of element checking: every element matches the inner type of at least
        # one allowed list (or the type of that list's own elements).
        for option in allowed:
            if not isinstance(option, list):
                return True, is_variable
            inner_answer = _answer_type(option)
            if all(type(x) is nested or (inner_answer is not None and type(x) is inner_answer) for x in value):
                return True, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _dict_ok(value: dict, allowed: list[Any]) -> bool:
    for option in allowed:
        if option == "" or not isinstance(option, dict):
            continue
        good = True
        for k, v in value.items():
            # A few answers give a plain value instead of a list of them: read it as the one allowed.
            allowed_k = option.get(k) if isinstance(option.get(k), list) else [option.get(k)]
            if k not in option or _std(v) not in [_std(a) for a in allowed_k]:
                good = False
                break
        if good and all(k in value or (isinstance(vals, list) and "" in vals) for k, vals in option.items()):
            return True
    return False


def _list_dict_ok(value: list, allowed: list[Any]) -> bool:
    for option in allowed:
        if not isinstance(option, list) or len(option) != len(value):
            continue
        if all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option, strict=True)):
            return True
    return False


def _list_ok(value: list, allowed: list[Any]) -> bool:
    got = [_std(v) for v in value]
    return any(isinstance(o, list) and got == [_std(x) for x in o] for o in allowed)


def check_one(doc: dict[str, Any], call: Call, expected: Call, language: str = "python") -> Verdict:
    """One call against one expected call (a dict with a single function name)."""
    (name, allowed_by_param), = expected.items()
    if name not in call:
        return Verdict(False, f"wrong function: expected {name}, got {next(iter(call), '(none)')}")
    args = call[name]
    if not isinstance(args, dict):
        return Verdict(False, f"{name}: arguments are not an object")
    params = doc.get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    for p in params.get("required") or []:
        if p not in args:
            return Verdict(False, f"{name}: missing required parameter {p!r}")
    for p, value in args.items():
        if p not in props or p not in allowed_by_param:
            return Verdict(False, f"{name}: unexpected parameter {p!r}")
        allowed = allowed_by_param[p]
        prop = props[p] if isinstance(props[p], dict) else {}
        type_name = prop.get("type") if isinstance(prop.get("type"), str) else "string"
        types = TYPES if language == "python" else (JAVA_TYPES if language == "java" else JS_TYPES)
        declared = types.get(type_name, str)
        nested = None
        if type_name in _NESTED and isinstance(prop.get("items"), dict):
            inner = prop["items"].get("type")
            nested = types.get(inner, str) if isinstance(inner, str) else None
        if language != "python":  # arguments are strings in the language's syntax
            if not isinstance(value, str):
                return Verdict(False, f"{name}: {p!r} must be a {language} literal in a string, got {value!r}")
            value = convert(value, prop, language)
        elif declared is float and type(value) is int:
            value = float(value)
        valid, is_variable = _type_ok(value, allowed, declared, nested)
        if not valid:
            return Verdict(False, f"{name}: wrong type for {p!r}: {type(value).__name__} ({value!r})")
        if not is_variable:
            if declared is dict:
                ok = _dict_ok(value, allowed)
            elif declared is list and nested is dict:
                ok = _list_dict_ok(value, allowed)
            elif declared is str:
                ok = standardize(value) in [standardize(a) for a in allowed if isinstance(a, str)]
            elif declared is list:
                ok = _list_ok(value, allowed)
            else:
                ok = value in allowed
        else:
            ok = value in allowed
        if not ok:
            return Verdict(False, f"{name}: wrong value for {p!r}: {value!r}, allowed {allowed!r}")
    for p, allowed in allowed_by_param.items():
        if p not in args and "" not in allowed:
            return Verdict(False, f"{name}: parameter {p!r} left out but not optional")
    return OK


def check_calls(
    docs: dict[str, dict[str, Any]], calls: list[Call], expected: list[Call], checker: str, language: str = "python"
) -> Verdict:
    """Score a whole answer. `checker`: simple | multiple | parallel (see cases.checker_for)."""
    if len(calls) != len(expected):
        return Verdict(False, f"wrong number of calls: expected {len(expected)}, got {len(calls)}")
    if not expected:
        return OK
    if checker != "parallel":
        name = next(iter(expected[0]))
        return check_one(docs.get(name, {}), calls[0], expected[0], language)
    used: set[int] = set()
    for i, exp in enumerate(expected):
        name = next(iter(exp))
        last = Verdict(False, "no calls left")
        for j, call in enumerate(calls):
            if j in used:
                continue
            last = check_one(docs.get(name, {}), call, exp, language)
            if last.correct:
                used.add(j)
                break
        if not last.correct:
            return Verdict(False, f"expected call {i} ({name}) has no match: {last.error}")
    return OK


def score_case(case: Any, calls: list[Call] | None) -> Verdict | None:
    """The verdict for a case given the calls the model made (names already mapped back).

    None means "not scorable" (recorded traffic without expected answers). `calls` None
    means the model answer could not be read (bad arguments JSON): always wrong, except
    that it is still "a call" for relevance.
    """
    if case.kind == "none":
        return None
    if case.kind == "irrelevance":
        return OK if calls is not None and not calls else Verdict(False, "made a call where none was wanted")
    if case.kind == "relevance":
        return OK if calls is None or calls else Verdict(False, "made no call")
    if calls is None:
        return Verdict(False, "tool call arguments are not valid JSON objects")
    return check_calls(case.functions, calls, case.expected or [], case.checker, case.language)


def ground_truth_calls(case: Any) -> list[Call]:
    """A model answer built from the expected answer (first allowed value of each
    parameter; optional ones left out). Used by tests and by
    the test upstream server, which answers with the ground truth."""
    if case.kind == "irrelevance":
        return []
    if case.kind == "relevance":
        name = next(iter(case.functions), "f")
        return [{name: {}}]
    out: list[Call] = []
    for exp in case.expected or []:
        (name, allowed_by_param), = exp.items()
        params = case.functions.get(name, {}).get("parameters") or {}
        required = params.get("required") or []
        props = params.get("properties") or {}
        args: dict[str, Any] = {}
        for p, allowed in allowed_by_param.items():
            picked = _first_value(allowed, optional=p not in required)
            if picked is not _ABSENT:
                args[p] = picked if case.language == "python" else render(picked, props.get(p) or {}, case.language)
        out.append({name: args})
    return out


_ABSENT = object()


def _first_value(allowed: Any, optional: bool = True) -> Any:
    if not isinstance(allowed, list):  # below the first level BFCL writes plain values
        return allowed
    if optional and "" in allowed:  # the smallest correct answer leaves it out
        return _ABSENT
    for a in allowed:
        if a == "":
            continue
        if isinstance(a, dict):
            return {k: v for k, vs in a.items() if (v := _first_value(vs)) is not _ABSENT}
        if isinstance(a, list) and a and all(isinstance(x, dict) for x in a):
            return [_first_value([x]) for x in a]
        return a
    return "" if allowed else _ABSENT
