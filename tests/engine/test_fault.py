"""Fail-stop: SIGKILL one rank of a TP=3 replica under load. The replica must stop answering
ready, end every open request (an error or a closed connection, never a hang), and exit
non-zero within seconds. On the shipped int4 weights: the failure is the point, not the dtype."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

from engine_support import INT4_SERVER_ARGS, EngineServer, get


def _rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(e for e in env if e.startswith(b"RANK=")).split(b"=", 1)[1])


def test_killed_rank_stops_the_replica(gguf_path: Path, tmp_path: Path) -> None:
    server = EngineServer(gguf_path, tmp_path / "engine.log", tp=3, extra=INT4_SERVER_ARGS)
    try:
        results: list[dict] = [{} for _ in range(4)]
        started = threading.Barrier(5, timeout=120)

        def client(i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"Tell me a long story number {i}."}],
                    "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
            req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            out = results[i]
            out["chunks"] = 0
            signalled = False
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    for line in r:
                        if line.startswith(b"data: {"):
                            obj = json.loads(line[6:])
                            if "error" in obj:
                                out["error"] = obj["error"]["message"]
                            else:
                                out["chunks"] += 1
                        if line.strip() == b"data: [DONE]":
                            out["done"] = True
                        if out["chunks"] >= 3 and not signalled:
                            signalled = True
                            started.wait()
            except Exception as e:  # a closed connection is an acceptable end
                out["exception"] = type(e).__name__
            finally:
                out["ended"] = time.monotonic()
                if not signalled:
                    started.abort()

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        started.wait()  # every stream is producing tokens
        victim = next(p for p in server.rank_pids() if _rank_of(p) == 2)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()

        not_ready_at = None
        while server.proc.poll() is None and time.monotonic() - killed < 30:
            if not_ready_at is None:
                try:
                    status, _ = get(server.url + "/health", timeout=1)
                except OSError:
                    status = -1
                if status != 200:
                    not_ready_at = time.monotonic()
            time.sleep(0.05)
        exited_at = time.monotonic()
        assert server.proc.poll() is not None, "the replica kept running after losing a rank"
        assert server.proc.returncode != 0
        assert exited_at - killed < 15, f"took {exited_at - killed:.1f}s to stop"
        assert not_ready_at is not None and not_ready_at <= exited_at
        for t in threads:
            t.join(10)
            assert not t.is_alive(), "a request hung after the rank died"
        for r in results:
            assert not r.get("done"), "a 400-token stream cannot have finished"
            assert r.get("error") or r.get("exception"), r
            assert r["ended"] - killed < 15
        assert "rank 2 exited" in server.output() or "engine stopped" in server.output()
    finally:
        server.close()
