"""Rank 0: start HTTP at once (so /health answers 503 while loading), load and test the
collectives in the engine thread, then schedule until shutdown or failure."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import uvicorn

from switchyard.engine.core.kv_blocks import BlockPool
from switchyard.engine.core.scheduler import Scheduler
from switchyard.engine.runner.model_runner import Runner
from switchyard.engine.serving.http import build_app
from switchyard.engine.serving.state import EngineState

log = logging.getLogger("switchyard.engine.serving.rank0")


def _tokenizer(runner: Runner):  # type: ignore[no-untyped-def]
    from switchyard.engine.chat import tokenizer
    from switchyard.engine.model.weights import GGUFSource

    src = runner.source
    if isinstance(src, GGUFSource):
        return tokenizer.from_gguf(src.reader)
    assert runner.config is not None
    return tokenizer.from_hf_dir(src.dir, set(runner.config.eos_token_ids))


def _structured_output(state: EngineState, runner: Runner) -> None:
    """Rank 0's grammar compiler for this tokenizer; without it the replica serves free text
    and refuses structured requests with a 400 that says why."""
    from switchyard.engine.chat.grammar import Grammars

    assert state.tokenizer is not None and runner.config is not None
    try:
        state.grammars = Grammars(state.tokenizer.tok.to_str(), runner.config.vocab_size,
                                  sorted(state.tokenizer.eos_ids), lanes=runner.opts.fill_lanes)
    except Exception as e:  # a tokenizer llguidance cannot read
        state.grammars_reason = f"{type(e).__name__}: {e}"
        log.warning("structured output unavailable: %s", state.grammars_reason)


def serve_rank0(runner: Runner, model_name: str, host: str, port: int) -> int:
    state = EngineState(model_name=model_name, tp=runner.world)
    app = build_app(state)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=3, access_log=False))
    result = {"code": 0}

    def engine() -> None:
        try:
            runner.setup()
            state.tokenizer = _tokenizer(runner)
            _structured_output(state, runner)
            state.collective = runner.collective_info
            state.max_model_len = runner.max_model_len
            state.load_seconds = runner.load_seconds
            state.dtype = runner.dtype
            assert runner.model is not None
            state.device = runner.model.status()
            state.device["kv_cache_dtype"] = runner.kv_cache_dtype
            if runner.dtype == "int4":
                from switchyard.engine.model.linear import int4_kernel

                state.device["int4_kernel"] = int4_kernel()
            assert runner.model is not None
            pool = BlockPool(runner.model.num_blocks, runner.opts.block_size, runner.opts.prefix_caching)
            sched = Scheduler(runner, state.tokenizer, runner.opts.max_num_seqs, runner.max_model_len,
                              max_waiting=runner.opts.max_waiting,
                              max_num_batched_tokens=runner.opts.max_num_batched_tokens, pool=pool,
                              overlap=runner.opts.async_decode)
            state.scheduler = sched
            state.phase = "ready"
            log.info("ready: %s tp=%d dtype=%s %s collective=%s (%.1fs)", model_name, runner.world, state.dtype,
                     state.device, state.collective.get("chosen"), runner.load_seconds)
            sched.loop()
        except BaseException as e:  # fail-stop: report, refuse new work, exit non-zero
            state.phase = "failed"
            state.reason = f"{type(e).__name__}: {e}"
            log.error("engine stopped: %s", state.reason)
            result["code"] = 1
            server.should_exit = True
            # If the graceful shutdown stalls (a client that never reads), exit anyway.
            threading.Timer(8.0, lambda: os._exit(1)).start()

    t = threading.Thread(target=engine, name="engine", daemon=True)
    t.start()
    # uvicorn re-raises the signal that stopped it once it is done; with these handlers in
    # place that re-raise is a no-op and we get to stop the followers and exit cleanly.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    server.run()
    if result["code"] == 0:
        if state.scheduler is not None and t.is_alive():
            state.phase = "stopping"
            state.scheduler.stop()
            t.join(10)
            runner.shutdown()
        elif t.is_alive():
            # Interrupted while loading: the followers are stopped by the supervisor.
            return 0
    if not server.started and result["code"] == 0:
        return 1  # could not bind the port
    time.sleep(0.05)
    return result["code"]
