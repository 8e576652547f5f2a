"""Request bodies parsed with bounded work: the containers, values, depth, messages, content parts and
tools of one request are capped (a 400 naming the limit), and nothing proportional to a large body
runs on the event loop.

Why the order matters: orjson holds the GIL for a whole `loads` (five million empty arrays: 0.4-2.5 s
on a shared EPYC core), so parsing in a thread alone would still freeze the loop. A body is therefore
*counted* before it is parsed, with C-speed bytes operations: `[`, `{` and `,` counted over the raw
bytes are an upper bound of its arrays and objects and of its values (a bracket inside a string
counts too). Only when that bound is over a limit are strings taken out (a regex over 64 KB windows,
so the GIL changes hands between windows) for the exact count; a body over a limit is refused
without ever being parsed. What is parsed is then small enough in structure for one `loads` to stay
in the tens of milliseconds, and the depth walk, the per-message validation and the feature
extraction of a large body run in a thread with the parse (`bounded`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from switchyard import errors

T = TypeVar("T")

# Bytes one C call looks at, so that a thread doing this hands the GIL to the loop every few ms:
WINDOW = 16 * 1024  # taking strings out (a regex: up to ~80 ns a byte when strings are short)
SLICE = 256 * 1024  # counting one byte value (memchr speed)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """Caps on the work one request body may cost. Defaults are far above what agent clients send
    (Claude Code and Codex: hundreds of messages, tens of tools, a few thousand containers)."""

    max_containers: int = 100_000  # JSON arrays and objects in the body
    max_items: int = 500_000  # array elements and object members (orjson: ~40 ms to build 500k)
    max_depth: int = 200  # nesting; orjson encodes at most 254 levels
    max_messages: int = 10_000
    max_parts: int = 50_000  # content parts over all messages
    max_tools: int = 1_000
    off_loop_bytes: int = 256 * 1024  # larger bodies are counted, parsed and checked in a thread
    off_loop_items: int = 10_000  # ... and so are smaller ones with more containers + items than this


DEFAULT_LIMITS = BodyLimits()

# Every byte but `[`, `{` and `,`: translate(None, this) keeps the structure in one C pass (~1 ns a
# byte; three bytes.count calls, which go a byte at a time, cost three times that).
_NOT_STRUCTURE = bytes(i for i in range(256) if i not in b"[{,")
# The counts `bounded` took of the body its work is about to parse (so parse_json does not count twice).
_COUNTED: ContextVar[tuple[bytes, Counts] | None] = ContextVar("switchyard_body_counted", default=None)
# The inside of a string, up to its closing quote (or the end of the window).
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)
# A string, or one left open at the end of the window (matched to its end, so a failed match never
# rescans it). Replaced by nothing: a constant replacement stays in C (a group reference in the
# template ran Python code for every match: 3.9M short strings took 1.2-1.8 s, now ~0.1 s).
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.S)


@dataclass(frozen=True, slots=True)
class Counts:
    containers: int  # arrays and objects
    items: int  # upper bound of array elements and object members: commas + containers
    exact: bool  # strings were taken out (False: an upper bound that was already within the limits)


def _refuse(what: str, limit: int, option: str, code: str) -> errors.BadRequest:
    return errors.BadRequest(f"the request body has more than {limit:,} {what} (the gateway's limit: {option})",
                             None, code)


def too_many_containers(limits: BodyLimits) -> errors.BadRequest:
    return _refuse("JSON arrays and objects", limits.max_containers, "--max-body-containers", "too_many_containers")


def too_many_items(limits: BodyLimits) -> errors.BadRequest:
    return _refuse("JSON values", limits.max_items, "--max-body-items", "too_many_values")


def _structure(data: bytes) -> tuple[int, int]:
    """(`[` and `{`, `,`) among these bytes."""
    s = data.translate(None, _NOT_STRUCTURE)
    commas = s.count(b",")
    return len(s) - commas, commas


def count(raw: bytes, limits: BodyLimits = DEFAULT_LIMITS) -> Counts:
    """Arrays, objects and values of a JSON body, counted without parsing it; BadRequest over a limit."""
    if len(raw) <= SLICE:
        containers, commas = _structure(raw)
    else:
        containers = commas = 0
        for i in range(0, len(raw), SLICE):
            c, k = _structure(raw[i:i + SLICE])
            containers += c
            commas += k
    if containers <= limits.max_containers and commas + containers <= limits.max_items:
        return Counts(containers, commas + containers, False)
    if b'"' not in raw:  # no strings: the counts are exact
        _check(containers, commas, limits)
        return Counts(containers, commas + containers, True)
    # Strings out, window by window: each window is one regex call, so a thread doing this gives
    # the loop the GIL every few milliseconds; a body over a limit stops as soon as it is over.
    # (The bound's scan above costs ~1 ms a MB; this one up to ~80 ms a MB of short strings.)
    containers = commas = 0
    n = len(raw)
    p = 0
    in_string = False
    while p < n:
        q = min(n, p + WINDOW)
        if in_string:  # a window of one long string: find where it closes, a window at a time too
            e = _STRING_BODY.match(raw, p, q).end()
            if e < q and raw[e] == 0x22:
                p, in_string = e + 1, False
            elif e >= n or e == p:  # a string never closed: not JSON, orjson will say where
                break
            else:  # the window ended inside it (maybe just before a backslash's escaped byte)
                p = e
            continue
        while q < n and raw[q - 1] == 0x5C:  # never end a window between a backslash and what it escapes
            q += 1
        window = raw[p:q]
        c, k = _structure(_STRINGS.sub(b"", window))
        containers += c
        commas += k
        if containers > limits.max_containers or commas + containers > limits.max_items:
            _check(containers, commas, limits)
        p = q
        # Did the window end inside a string? An odd number of quotes that are not escaped: with
        # escaped backslashes (pairs) taken out, a quote after a backslash is escaped (a window
        # never ends inside a run of backslashes, and starts outside a string).
        bare = window.replace(b"\\\\", b"")
        in_string = (bare.count(b'"') - bare.count(b'\\"')) % 2 == 1
    return Counts(containers, commas + containers, True)


def _check(containers: int, commas: int, limits: BodyLimits) -> None:
    if containers > limits.max_containers:
        raise too_many_containers(limits)
    if commas + containers > limits.max_items:
        raise too_many_items(limits)


def json_depth(value: Any, limit: int | None = None) -> int:
    """How deeply arrays and objects nest in a parsed JSON value, a level at a time (no recursion;
    5-17x the speed of a stack of (value, depth) pairs); stops once past `limit`."""
    if not isinstance(value, dict | list):
        return 0
    level = [value]
    depth = 0
    while level:
        depth += 1
        if limit is not None and depth > limit:
            break
        nxt: list[Any] = []
        add = nxt.append
        for v in level:
            for x in v.values() if type(v) is dict else v:
                t = type(x)
                if t is dict or t is list:
                    add(x)
        level = nxt
    return depth


def parse_json(raw: bytes, limits: BodyLimits = DEFAULT_LIMITS) -> Any:
    """A request body as JSON: counted first (a 400 over a limit, before any parse), then parsed
    (a 400 for what does not parse) and checked for depth (a 400 past `max_depth`). Runs where it
    is called: `bounded` decides whether that is the loop."""
    got = _COUNTED.get()
    counts = got[1] if got is not None and got[0] is raw else count(raw, limits)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise errors.BadRequest(f"could not parse the JSON body: {e}") from None
    # Deeper than the encoder takes, the body could not be sent upstream or answered (a 500 on
    # re-encoding): refuse it now. A body with fewer containers than the limit cannot be that deep,
    # so most are never walked.
    if counts.containers > limits.max_depth and json_depth(body, limits.max_depth) > limits.max_depth:
        raise errors.BadRequest(f"the JSON body is nested deeper than {limits.max_depth} levels")
    return body


def check_request(chat: Mapping[str, Any], limits: BodyLimits = DEFAULT_LIMITS) -> None:
    """The normalised (Chat Completions) request within the caps on messages, content parts and tools."""
    msgs = chat.get("messages")
    if isinstance(msgs, list):
        if len(msgs) > limits.max_messages:
            raise errors.BadRequest(f"the request has {len(msgs):,} messages; the gateway takes at most "
                                    f"{limits.max_messages:,} (--max-messages)", "messages", "too_many_messages")
        parts = 0
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                parts += len(c)
        if parts > limits.max_parts:
            raise errors.BadRequest(f"the request has {parts:,} content parts; the gateway takes at most "
                                    f"{limits.max_parts:,} over all messages (--max-content-parts)", "messages",
                                    "too_many_content_parts")
    tools = chat.get("tools")
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise errors.BadRequest(f"the request has {len(tools):,} tools; the gateway takes at most "
                                f"{limits.max_tools:,} (--max-tools)", "tools", "too_many_tools")


async def bounded(raw: bytes, work: Callable[[bytes], T], limits: BodyLimits = DEFAULT_LIMITS) -> T:
    """`work(raw)` (parse, validate, extract: everything proportional to the body) inline for a
    small body, in a thread for a large one (over `off_loop_bytes`: counted there too) or a dense
    one (more than `off_loop_items` values). Its exceptions propagate either way."""
    if len(raw) > limits.off_loop_bytes:
        return await asyncio.to_thread(work, raw)
    counts = count(raw, limits)  # on the loop: ~1 ns a byte, and at most off_loop_bytes of them
    token = _COUNTED.set((raw, counts))
    try:
        if counts.items > limits.off_loop_items:
            return await asyncio.to_thread(work, raw)
        return work(raw)
    finally:
        _COUNTED.reset(token)
