"""`switchyard serve --record FILE`: live traffic written as a replayable JSONL trace.

Each request becomes one line in the JSONL trace form (jsonl.py) without `expected`:
the OpenAI body, `id`, `session_id`, and under `_switchyard` the routing decision and the
time. Lines are queued and written by one background thread, so the event loop only pays
for a queue put; when the queue is full (disk far slower than traffic) lines are dropped
and counted rather than slowing requests down.

The trace is bounded on disk: past `max_bytes` the file is rotated (FILE -> FILE.1 -> ... ->
FILE.keep, the oldest deleted), so at most (keep + 1) x max_bytes are ever kept. A single line
over `max_bytes` is dropped (and counted), not written.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

_STOP = object()
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_KEEP = 3


class TraceRecorder:
    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP,
                 max_queue: int = 10_000):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max(1, max_bytes)
        self.keep = max(0, keep)
        self.rotations = 0
        self._file = self._open()
        self._size = os.fstat(self._file.fileno()).st_size
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._prefix = uuid.uuid4().hex[:8]
        self._counter = itertools.count(1)
        self.written = 0
        self.dropped = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="switchyard-recorder", daemon=True)
        self._thread.start()

    def record(self, request_body: dict[str, Any], session_id: str | None, decision: dict[str, Any]) -> None:
        """Queue one request for writing; never blocks."""
        if self._closed:
            return
        line: dict[str, Any] = {k: v for k, v in request_body.items() if k not in ("id", "expected")}
        line["id"] = f"rec-{self._prefix}-{next(self._counter)}"
        if session_id is not None:
            line["session_id"] = session_id
        line["_switchyard"] = {"ts": round(time.time(), 3), "decision": decision}
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            batch = [item]
            # Drain what is already queued so one write+flush serves many lines.
            while len(batch) < 512:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    self._write(batch)
                    return
                batch.append(nxt)
            self._write(batch)

    def _open(self) -> Any:
        # Traces hold whole conversations: readable by the gateway's user alone.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab")

    def _rotate(self) -> None:
        """FILE -> FILE.1 -> ... -> FILE.keep (the oldest goes); a fresh FILE (in the writer thread)."""
        self._file.close()
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            for i in range(self.keep - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()
        self._size = 0
        self.rotations += 1

    def _write(self, batch: list[dict[str, Any]]) -> None:
        lines = [orjson.dumps(x, default=str) + b"\n" for x in batch]
        out: list[bytes] = []
        for line in lines:
            if len(line) > self.max_bytes:
                self.dropped += 1
                continue
            if self._size + len(line) > self.max_bytes:
                self._flush(out)
                out = []
                self._rotate()
            out.append(line)
            self._size += len(line)
        self._flush(out)

    def _flush(self, lines: list[bytes]) -> None:
        if lines:
            self._file.write(b"".join(lines))
            self._file.flush()
            self.written += len(lines)

    def close(self) -> None:
        """Write what is queued, then close the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout=10)
        self._file.close()
