"""`switchyard up`: the embedded default. Starts the engine replicas a policy's pools name
(each pool's `engine:` block), waits until each answers /health, starts the gateway in front
of them, and stops everything on Ctrl-C / SIGTERM (gateway first, then the replicas)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer


@dataclass
class _Child:
    name: str
    cmd: list[str]
    log: Path
    health: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from switchyard.engine.serving.launch import die_with_parent_term

        f = self.log.open("wb")
        # A new session: Ctrl-C reaches `up` only, which then stops the children in order;
        # if `up` itself is killed, the children get SIGTERM rather than living on.
        self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent_term)
        f.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _stop(children: list[_Child], timeout: float = 20.0) -> None:
    for c in children:
        if c.alive():
            assert c.proc is not None
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
            # Gateway first, so no request is sent to a replica that is going away.
            if c.name == "gateway":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.proc.wait(timeout)
    deadline = time.monotonic() + timeout
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def up(
    policy: Annotated[Path, typer.Option(help="Policy whose pools' `engine:` blocks say what to start")] = Path(
        "policies/default.yaml"),
    host: Annotated[str, typer.Option(help="Gateway address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Gateway port")] = 8000,
    startup_timeout: Annotated[float, typer.Option(help="Seconds to wait for each server")] = 600.0,
    log_dir: Annotated[Path | None, typer.Option(help="Where the servers' logs go (default: a cache dir)")] = None,
) -> None:
    """Start the engine replicas of a policy and the gateway in front of them."""
    from switchyard import datasets
    from switchyard.engine.serving import registry
    from switchyard.policy.loader import PolicyError, load_policy

    try:
        spec = load_policy(policy)
    except PolicyError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    logs = log_dir or datasets.cache_dir("logs") / f"{time.strftime('up-%Y%m%d-%H%M%S')}-{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "switchyard.cli"]
    children: list[_Child] = []
    # The same planner as a cluster (`switchyard plan`), on a one-node cluster: this machine.
    from switchyard.cluster.local import local_launches
    from switchyard.cluster.placement import PlanError

    try:
        launches = local_launches(spec, base=policy.parent)
    except PlanError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    for launch in launches:
        pool = spec.pools[launch.pool]
        if launch.command is None or pool.engine is None:
            continue  # not ours to start: expected to be running already
        try:
            registry.resolve(pool.engine.model)  # pulls a known model when missing
        except (registry.ModelNotFound, RuntimeError) as e:
            typer.echo(f"error: pool {launch.pool}: {e}", err=True)
            raise typer.Exit(2) from None
        if not _port_free(launch.host, launch.port):
            typer.echo(f"error: pool {launch.pool}: port {launch.port} ({launch.url}) is already in use", err=True)
            raise typer.Exit(2)
        cmd = [*launch.command, "--served-model-name", pool.model]
        children.append(_Child(launch.replica, cmd, logs / f"{launch.replica}.log",
                               f"http://{launch.host}:{launch.port}/health"))
    if not _port_free(host, port):
        typer.echo(f"error: gateway port {port} is already in use", err=True)
        raise typer.Exit(2)
    gateway = _Child("gateway", [*py, "serve", "--policy", str(policy), "--host", host, "--port", str(port)],
                     logs / "gateway.log", f"http://{host}:{port}/health")

    stop = threading.Event()
    old = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    started: list[_Child] = []
    code = 0
    try:
        for c in children:
            typer.echo(f"starting {c.name}: {' '.join(c.cmd[1:])}  (log: {c.log})")
            c.start()
            started.append(c)
        for c in [*children, gateway]:
            if c is gateway:
                typer.echo("starting gateway")
                c.start()
                started.insert(0, c)
            deadline = time.monotonic() + startup_timeout
            while not _ok(c.health):
                if stop.is_set():
                    raise KeyboardInterrupt
                if not c.alive():
                    typer.echo(f"error: {c.name} exited during start-up; its log ({c.log}):\n{c.tail()}", err=True)
                    code = 1
                    raise KeyboardInterrupt
                if time.monotonic() > deadline:
                    typer.echo(f"error: {c.name} not ready after {startup_timeout:.0f}s; log: {c.log}", err=True)
                    code = 1
                    raise KeyboardInterrupt
                time.sleep(0.25)
            typer.echo(f"{c.name} ready ({c.health})")
        typer.echo("")
        typer.echo(f"Switchyard is up. Point an OpenAI client at http://{host}:{port}/v1")
        typer.echo(f'  e.g. OpenAI(base_url="http://{host}:{port}/v1", api_key="none"), model="auto"')
        typer.echo(f"Logs: {logs}. Ctrl-C stops everything.")
        while not stop.is_set():
            dead = [c for c in started if not c.alive()]
            if dead:
                c = dead[0]
                typer.echo(f"error: {c.name} exited with {c.proc.returncode if c.proc else '?'}; stopping. "
                           f"Its log ({c.log}):\n{c.tail()}", err=True)
                code = 1
                break
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        typer.echo("stopping...")
        _stop(started)
        for s, h in old.items():
            signal.signal(s, h)
    if code:
        raise typer.Exit(code)
    typer.echo("stopped")
