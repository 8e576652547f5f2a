"""The in-process tier: the gateway's own logic without starting a process.

`create_app` runs under httpx's ASGITransport, its lifespan entered by hand (health checks, policy
watching and state sync run as in `serve`), on an event loop in a background thread, so that sync
tests (hypothesis included) call it as they would call a process. The test upstreams are
tests/fake_upstream.py itself, one fresh copy of the module each (its state is module-global),
served by uvicorn on a loopback socket in the same loop: the gateway's aiohttp client needs a real
socket, and `/_control` and `/_state` answer over HTTP as they do from the process.

What this tier cannot show stays with real processes (tests/procs.py): signals, drain, TLS, a
replica that dies, slow clients, the CLI, Redis, the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import logging
import socket
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import gwkit
import httpx
import uvicorn
from procs import ROOT

from switchyard.api.app import GatewayConfig, create_app

T = TypeVar("T")
FAKE_UPSTREAM = ROOT / "tests" / "fake_upstream.py"


class Loop:
    """An asyncio loop in a daemon thread; `run` waits for a coroutine's result from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="inproc-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()


class Upstream:
    """One tests/fake_upstream.py, on its own copy of the module so that its STATE is its own."""

    _copies = 0

    def __init__(self, loop: Loop, name: str, *, max_model_len: int = 0, keep_alive: float = 5.0) -> None:
        Upstream._copies += 1
        spec = importlib.util.spec_from_file_location(f"_fake_upstream_{Upstream._copies}", FAKE_UPSTREAM)
        assert spec is not None and spec.loader is not None
        self.module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.module)
        self.module.STATE.update(self.module._config(argparse.Namespace(
            name=name, delay_ms=0.0, fail=0, fail_first=0, max_model_len=max_model_len)))
        self.loop = loop
        self.http = Served(loop, self.module.app, keep_alive)
        self.port, self.url = self.http.port, self.http.url
        self.stopped = False

    @property
    def state(self) -> dict:
        return self.module.STATE

    @property
    def p(self) -> Upstream:  # gwkit.Cluster asks a process `ups[name][0].p.poll()`
        return self

    def poll(self) -> int | None:
        return 0 if self.stopped else None

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.http.stop()


class Served:
    """An ASGI app on a loopback socket, served by uvicorn on the kit's loop (lifespan off: the
    caller runs it)."""

    def __init__(self, loop: Loop, app: Any, keep_alive: float = 5.0) -> None:
        # IPPROTO_TCP said outright: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
        # without it every answer waits out a delayed ACK (45 ms a request, measured).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                    timeout_keep_alive=keep_alive))
        # _serve, not serve: serve would take over the test process's signal handlers.
        self._task = asyncio.run_coroutine_threadsafe(self.server._serve(sockets=[self.sock]), loop.loop)
        loop.run(self._started())

    async def _started(self) -> None:
        while not self.server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self.server.should_exit = True
        self._task.result(10)
        self.sock.close()


class Gateway:
    """`create_app(config)` with its lifespan running; `request` and friends go through ASGITransport.
    `output()` is what the gateway logged (switchyard.*, INFO and up), as a process's log would be."""

    def __init__(self, loop: Loop, config: GatewayConfig, **app_kw: Any) -> None:
        self.loop = loop
        self._log = _Capture()
        self._logger = logging.getLogger("switchyard")
        self._level = self._logger.level
        self._logger.addHandler(self._log)
        self._logger.setLevel(logging.INFO)
        self.app = create_app(config, **app_kw)
        self._lifespan = self.app.router.lifespan_context(self.app)
        loop.run(self._lifespan.__aenter__())
        self._served: Served | None = None
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://127.0.0.1",
                                        timeout=30)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.loop.run(self.client.request(method, path, **kw))

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def output(self) -> str:
        return self._log.text()

    def serve(self) -> str:
        """Also serve the app on a loopback socket (for real clients: the OpenAI SDK, aiohttp); its URL."""
        if self._served is None:
            self._served = Served(self.loop, self.app)
        return self._served.url

    def stop(self) -> None:
        if self._served is not None:
            self._served.stop()
        self.loop.run(self.client.aclose())
        self.loop.run(self._lifespan.__aexit__(None, None, None))
        gc.unfreeze()  # the lifespan froze the GC generations, as a long-lived server should; a test is not one
        self._logger.removeHandler(self._log)
        self._logger.setLevel(self._level)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self.lines)


class Stack:
    """A loop with the upstreams and gateways started on it; `close` stops them all (a gateway first)."""

    def __init__(self) -> None:
        self.loop = Loop()
        self.upstreams: list[Upstream] = []
        self.gateways: list[Gateway] = []

    def upstream(self, name: str, **kw: Any) -> Upstream:
        u = Upstream(self.loop, name, **kw)
        self.upstreams.append(u)
        return u

    def gateway(self, policies: list[str | Path], **config: Any) -> Gateway:
        g = Gateway(self.loop, GatewayConfig(policies=list(policies), **config))
        self.gateways.append(g)
        return g

    def close(self) -> None:
        for u in self.upstreams:  # all at once: each server notices on its next 0.1 s tick
            u.http.server.should_exit = True
        for g in self.gateways:
            if g._served is not None:
                g._served.server.should_exit = True
        for g in self.gateways:
            with contextlib.suppress(Exception):
                g.stop()
        for u in self.upstreams:
            with contextlib.suppress(Exception):
                u.stop()
        self.loop.close()


def make_cluster(s: Stack, tmp: Path, *, max_inflight: int = 32, queue_size: int = 64, timeout: str = "10s",
                 pin: str = "none") -> gwkit.Cluster:
    """gwkit's cluster (its policy, three upstreams) in process, the gateway served on a loopback
    socket so that tests written for a process (SDK clients, `c.url`) run unchanged."""
    ups = {n: s.upstream(n) for n in ("s0", "s1", "l0")}
    policy = tmp / "test.yaml"
    policy.write_text(gwkit.POLICY.format(max_inflight=max_inflight, queue_size=queue_size, timeout=timeout, pin=pin,
                                          s0=ups["s0"].url, s1=ups["s1"].url, l0=ups["l0"].url))
    gw = s.gateway([policy])
    return gwkit.Cluster(tmp, {n: (u, u.url) for n, u in ups.items()}, gw, gw.serve(), policy)  # type: ignore[arg-type]


@contextlib.contextmanager
def stack() -> Iterator[Stack]:
    s = Stack()
    try:
        yield s
    finally:
        s.close()
