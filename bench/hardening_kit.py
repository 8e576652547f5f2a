"""bench/hardening.py's client side: what each input got (Tally, Outcome) and how inputs are sent
(over httpx, or raw bytes on a socket); the gateway's memory read from /proc."""

from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


SLOW_KINDS = frozenset({"slow: silent socket", "slow: trickled headers", "slow: unfinished body",
                        "slow: stopped reading"})


POLICY_REFUSED = "200, policy refused"  # the UI's validate and preview answer 200 with the issues


@dataclass
class Outcome:
    kind: str
    label: str
    status: int | str  # an HTTP status, or what happened instead: POLICY_REFUSED, closed, cut, hang, error
    ms: float
    peak_raise_kb: int  # how much the gateway's VmHWM rose by the time this input was answered
    t_end: float = 0.0  # perf_counter when it was answered (which input was in flight when the loop stalled)


@dataclass
class Tally:
    pid: int
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hwm: int = 0

    def add(self, kind: str, label: str, status: int | str, ms: float) -> None:
        with self.lock:
            hwm = mem_kb(self.pid).get("VmHWM", self.hwm)
            self.outcomes.append(Outcome(kind, label, status, ms, max(0, hwm - self.hwm), time.perf_counter()))
            self.hwm = max(self.hwm, hwm)


def refused(o: Outcome) -> bool:
    """A refusal: a 4xx, a policy the UI refused, or a connection the gateway cut."""
    return (isinstance(o.status, int) and 400 <= o.status < 500) or o.status in (POLICY_REFUSED, "closed", "cut")


def _policy_refused(path: str, r: httpx.Response) -> bool:
    if r.status_code != 200 or not path.startswith("/ui/api/policies/"):
        return False
    body = r.json()
    return body.get("ok") is False if path.endswith("/validate") else bool(body.get("issues")) and "edited" not in body


# --- senders ------------------------------------------------------------------------------


def send_http(t: Tally, c: httpx.Client, kind: str, label: str, method: str, path: str, *,
              content: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 15.0) -> None:
    t0 = time.perf_counter()
    try:
        r = c.request(method, path, content=content, headers=headers, timeout=timeout)
        status: int | str = POLICY_REFUSED if _policy_refused(path, r) else r.status_code
        if r.status_code >= 500:
            label = f"{label} -> {r.text[:200]}"
    except httpx.TimeoutException:
        status = "hang"
    except httpx.RemoteProtocolError:
        status = "closed"
    except (httpx.HTTPError, OSError) as e:
        status, label = "error", f"{label} ({type(e).__name__}: {e})"
    t.add(kind, label, status, (time.perf_counter() - t0) * 1000)


def send_raw(t: Tally, port: int, kind: str, label: str, data: bytes, timeout: float = 15.0) -> None:
    """Raw bytes on a fresh connection; the status of what comes back, or how the gateway ended it."""
    t0 = time.perf_counter()
    status: int | str
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            try:
                s.sendall(data)
            except OSError:
                pass  # the gateway may answer (431, 413) and close before it has read everything
            head = s.recv(64)
            status = int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else "closed"
    except TimeoutError:
        status = "hang"
    except ConnectionResetError:
        status = "closed"
    t.add(kind, label, status, (time.perf_counter() - t0) * 1000)


def json_post(t: Tally, c: httpx.Client, kind: str, label: str, path: str, body: bytes) -> None:
    send_http(t, c, kind, label, "POST", path, content=body, headers={"content-type": "application/json"})


def mem_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0])
    return out

