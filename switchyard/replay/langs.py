"""Java and JavaScript categories: every argument is a string in that language's syntax.

BFCL's simple_java and simple_javascript offer every parameter to the model as a string
("This is Java long type parameter in string representation"); the scorer reads the
string back as a value of the declared type (`42L` -> 42, `new int[]{1, 2}` -> [1, 2],
`{a: 1}` -> {"a": 1}) and then applies the usual AST rules. A string that does not read
as its type stays a string (BFCL's rule: it may be a variable name, compared as text).

This is a small literal parser of our own, not BFCL's regular expressions.
"""

from __future__ import annotations

import re
from typing import Any

JAVA_TYPES: dict[str, type] = {
    "byte": int, "short": int, "integer": int, "long": int, "float": float, "double": float,
    "boolean": bool, "char": str, "String": str, "any": str, "Array": list, "ArrayList": list,
    "HashMap": dict,
}
JS_TYPES: dict[str, type] = {
    "String": str, "integer": int, "float": float, "Bigint": int, "Boolean": bool, "dict": dict,
    "array": list, "any": str,
}
HINTS = {
    "java": " Note that the provided function is in Java 8 SDK syntax.",
    "javascript": " Note that the provided function is in JavaScript syntax.",
}


class _Unreadable(ValueError):
    pass


_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[lLfFdDn]?")
_IDENT = re.compile(r"[A-Za-z_$][\w$.]*(?:\(\))?")


class _Reader:
    """Recursive-descent reader of Java/JS literals: numbers, strings, booleans, null, arrays,
    lists and maps in the forms models write them."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self, token: str) -> bool:
        self.ws()
        return self.s.startswith(token, self.i)

    def take(self, token: str) -> None:
        if not self.peek(token):
            raise _Unreadable(f"expected {token!r} at {self.i}")
        self.i += len(token)

    def take_re(self, rx: re.Pattern[str]) -> str:
        self.ws()
        m = rx.match(self.s, self.i)
        if not m:
            raise _Unreadable(f"unexpected text at {self.i}")
        self.i = m.end()
        return m.group(0)

    def items(self, close: str) -> list[Any]:
        out: list[Any] = []
        if self.peek(close):
            self.take(close)
            return out
        while True:
            out.append(self.value())
            if self.peek(","):
                self.take(",")
                continue
            self.take(close)
            return out

    def string(self) -> str:
        quote = self.s[self.i]
        j = self.i + 1
        buf = []
        while j < len(self.s) and self.s[j] != quote:
            if self.s[j] == "\\" and j + 1 < len(self.s):
                j += 1
            buf.append(self.s[j])
            j += 1
        if j >= len(self.s):
            raise _Unreadable("unterminated string")
        self.i = j + 1
        return "".join(buf)

    def java_block(self, verb: str) -> list[list[Any]]:
        # `{{ add(x); add(y); }}` / `{{ put(k, v); }}`: double-brace initialisation
        calls: list[list[Any]] = []
        self.take("{")
        double = self.peek("{")
        if double:
            self.take("{")
        while not self.peek("}"):
            self.take(verb)
            self.take("(")
            calls.append(self.items(")"))
            if self.peek(";"):
                self.take(";")
        self.take("}")
        if double:
            self.take("}")
        return calls

    def value(self) -> Any:
        self.ws()
        if self.i >= len(self.s):
            raise _Unreadable("nothing to read")
        c = self.s[self.i]
        if c in "\"'`":
            return self.string()
        if c == "[":
            self.take("[")
            return self.items("]")
        if c == "{":
            return self.js_object()
        if self.peek("new "):
            return self.java_new()
        for prefix in ("Arrays.asList(", "List.of(", "Set.of("):
            if self.peek(prefix):
                self.take(prefix)
                return self.items(")")
        if self.peek("Map.of("):
            self.take("Map.of(")
            flat = self.items(")")
            return {str(flat[k]): flat[k + 1] for k in range(0, len(flat) - 1, 2)}
        if _NUMBER.match(self.s, self.i):
            return _number(self.take_re(_NUMBER))
        word = self.take_re(_IDENT)
        return {"true": True, "false": False, "null": None, "undefined": None}.get(word, word)

    def js_object(self) -> dict[str, Any]:
        self.take("{")
        out: dict[str, Any] = {}
        while not self.peek("}"):
            self.ws()
            key = self.string() if self.s[self.i] in "\"'" else self.take_re(_IDENT)
            self.take(":")
            out[str(key)] = self.value()
            if self.peek(","):
                self.take(",")
        self.take("}")
        return out

    def java_new(self) -> Any:
        self.take("new ")
        name = self.take_re(re.compile(r"[\w$.]+"))
        if self.peek("<"):  # generics, possibly nested
            depth = 0
            while self.i < len(self.s):
                ch = self.s[self.i]
                self.i += 1
                depth += ch == "<"
                depth -= ch == ">"
                if depth == 0:
                    break
        if self.peek("["):  # arrays: new int[]{...}, new String[][]{...}
            while self.peek("["):
                self.take("[")
                self.take("]")
            self.take("{")
            return self.items("}")
        self.take("(")
        args = self.items(")")
        is_map = "Map" in name or "Hashtable" in name
        if self.peek("{"):
            calls = self.java_block("put" if is_map else "add")
            if is_map:
                return {str(c[0]): c[1] for c in calls if len(c) >= 2}
            return [c[0] for c in calls if c]
        if len(args) == 1 and isinstance(args[0], list | dict):
            return args[0]  # new ArrayList<>(Arrays.asList(...)), new HashMap<>(Map.of(...))
        return {} if is_map else args  # new HashMap<>(), new ArrayList<>(), new Array(1, 2)


def _number(text: str) -> int | float:
    body = text.rstrip("lLfFdDn")
    if re.fullmatch(r"-?\d+", body) and text[-1:] not in "fFdD":
        return int(body)
    return float(body)


def read_literal(text: str) -> Any:
    r = _Reader(text)
    v = r.value()
    r.ws()
    if r.i != len(r.s):
        raise _Unreadable("text after the value")
    return v


def _scalar(value: str, type_name: str, language: str) -> Any:
    v = value.strip()
    if type_name in ("byte", "short", "integer", "long", "Bigint"):
        m = re.fullmatch(r"(-?\d+)[lLn]?", v)
        return int(m.group(1)) if m else value
    if type_name in ("float", "double"):
        m = re.fullmatch(r"(-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFdD]?", v)
        return float(m.group(1)) if m else value
    if type_name in ("boolean", "Boolean"):
        return {"true": True, "false": False}.get(v, value)
    if type_name in ("String", "char"):
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'`":
            return v[1:-1]
        return value
    return value  # any: the text itself


def convert(value: Any, prop: dict[str, Any], language: str) -> Any:
    """A model's string argument read as the declared type; unreadable text stays text."""
    if not isinstance(value, str):
        return value  # the type check then fails: these categories want strings
    type_name = prop.get("type") if isinstance(prop.get("type"), str) else "any"
    expected = (JAVA_TYPES if language == "java" else JS_TYPES).get(type_name, str)
    if expected is list or expected is dict:
        try:
            parsed = read_literal(value)
        except _Unreadable:
            return value
        if expected is list and isinstance(parsed, list):
            inner = (prop.get("items") or {}).get("type") if isinstance(prop.get("items"), dict) else None
            if isinstance(inner, str):
                return [_scalar(str(x), inner, language) if isinstance(x, str | int | float) and not isinstance(x, bool)
                        and inner not in ("String", "char", "any") else x for x in parsed]
            return parsed
        if expected is dict and isinstance(parsed, dict):
            return parsed
        return value
    return _scalar(value, type_name, language)


def render(value: Any, prop: dict[str, Any], language: str) -> str:
    """A value written as that language's literal (ground truth fed back as model output)."""
    type_name = prop.get("type") if isinstance(prop.get("type"), str) else "any"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}L" if type_name == "long" else (f"{value}n" if type_name == "Bigint" else str(value))
    if isinstance(value, float):
        return f"{value!r}f" if type_name == "float" and language == "java" else repr(value)
    inner = (prop.get("items") or {}) if isinstance(prop.get("items"), dict) else {}
    if isinstance(value, list):
        parts = ", ".join(_quoted(x, inner, language) for x in value)
        if language == "java":
            return f"new ArrayList<>(Arrays.asList({parts}))" if type_name == "ArrayList" else f"new Object[]{{{parts}}}"
        return f"[{parts}]"
    if isinstance(value, dict):
        if language == "java":
            puts = " ".join(f'put("{k}", {_quoted(v, {}, language)});' for k, v in value.items())
            return f"new HashMap<String, Object>() {{{{ {puts} }}}}"
        return "{" + ", ".join(f"{k}: {_quoted(v, {}, language)}" for k, v in value.items()) + "}"
    return str(value)


def _quoted(v: Any, prop: dict[str, Any], language: str) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return render(v, prop, language)


def string_params(functions: list[dict[str, Any]], language: str) -> list[dict[str, Any]]:
    """The function docs as BFCL shows them to a model: each parameter a string, its real
    type said in the description."""
    lang = "Java" if language == "java" else "JavaScript"
    out = []
    for fn in functions:
        params = dict(fn.get("parameters") or {})
        props = {}
        for name, p in (params.get("properties") or {}).items():
            q = dict(p)
            t = q.get("type", "any")
            desc = str(q.get("description", ""))
            if t == "any":
                desc += f" This parameter can be of any type of {lang} object in string representation."
            else:
                desc += f" This is {lang} {t} type parameter in string representation."
            if isinstance(q.get("items"), dict) and t in ("Array", "ArrayList", "array"):
                desc += f" The list elements are of type {q['items'].get('type')}; they are not in string representation."
                q.pop("items")
            if language == "javascript" and t == "dict" and "properties" in q:
                q.pop("properties")
            q["description"], q["type"] = desc, "string"
            props[name] = q
        params["properties"] = props
        out.append({**fn, "description": str(fn.get("description", "")) + HINTS[language], "parameters": params})
    return out
