"""Engine test fixtures: the real SmolLM2 file (and its float32 weights, read once), the servers
tests share (float32 and int4, one each per session), and one thread for whole-model work in
this process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton decode kernels run in Triton's interpreter. The variable is read when
# a Triton function is defined, Triton's own library included, so it is set before anything
# imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_support import INT4_SERVER_ARGS, PAIR_ARGS, SERVER_ARGS, EngineServer, smollm2_path  # noqa: E402


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    return smollm2_path()


@pytest.fixture(scope="session")
def server_tp1(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("tp1") / "engine.log", tp=1, extra=SERVER_ARGS)
    yield s
    s.close()


@pytest.fixture(scope="session")
def server_int4(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """The shipped defaults (int4 weights on the native kernels where the CPU has them, float16
    cache): for the tests where float32 is not the point. Each row's result is the same whatever
    batch it runs in, as with float32, and a step costs a third of float32's."""
    s = EngineServer(gguf_path, tmp_path_factory.mktemp("int4") / "engine.log", tp=1, extra=INT4_SERVER_ARGS)
    yield s
    s.close()


@pytest.fixture(scope="session")
def replica_pair(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineServer, ...]]:
    """Two replicas (shipped int4, one thread each: they share two cores, and no OpenMP worker
    spins between steps), started side by side: the balancing tests' (cache_aware, least_load)."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("pair")

    def start(name: str) -> EngineServer:
        return EngineServer(gguf_path, tmp / f"{name}.log", extra=PAIR_ARGS, env={"GOMP_SPINCOUNT": "0"})

    with ThreadPoolExecutor(2) as pool:  # loading the model is most of the cost
        futs = [pool.submit(start, n) for n in ("r0", "r1")]
    engines = [f.result() for f in futs if f.exception() is None]
    if len(engines) < 2:
        for e in engines:
            e.close()
        raise next(f.exception() for f in futs if f.exception() is not None)  # type: ignore[misc]
    yield tuple(engines)
    with ThreadPoolExecutor(2) as pool:  # an engine takes seconds to stop: both at once
        list(pool.map(EngineServer.close, engines))


@pytest.fixture(scope="session")
def smollm2(gguf_path: Path):  # type: ignore[no-untyped-def]
    """SmolLM2's config, float32 weights (one rank), tokenizer, and three chat prompts, read once
    (the GGUF's dequantisation takes seconds)."""
    from switchyard.engine.chat.tokenizer import from_gguf
    from switchyard.engine.model.weights import load_shard, open_source

    src = open_source(gguf_path)
    tok = from_gguf(src.reader)
    prompts = [tok.encode(tok.render([{"role": "user", "content": p}]))
               for p in ("What is the capital of France?", "Name three fruits.", "Count from one to five.")]
    return src.config, load_shard(src, 0, 1), tok, prompts


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Whole-model runs in this process on one thread. Two OpenMP threads a layer wait on each
    other at every op, and on a 2-core machine whose cores are also the servers' (and another
    user's), each wait can be a time slice: SmolLM2 float32, 3 prompts x 24 greedy tokens took
    35.6 s on two threads and 5.2 s on one (the shared 2-core AMD EPYC, loaded). The servers and
    the kernel tests keep every core."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
