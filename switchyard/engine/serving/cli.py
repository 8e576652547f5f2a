"""`switchyard engine ...` and `switchyard models ...` (owned by the engine work).

Keep torch imports inside the commands: every `switchyard` start imports this module.
"""

from __future__ import annotations

import logging
import os

import typer

engine_app = typer.Typer(no_args_is_help=True)
models_app = typer.Typer(no_args_is_help=True)


@models_app.command("pull")
def models_pull(name: str = typer.Argument(..., help="A known model, e.g. smollm2-135m")) -> None:
    """Fetch a model into ~/.cache/switchyard/models and verify its checksum."""
    from switchyard.engine.serving import registry

    try:
        path = registry.pull(name)
    except (registry.ModelNotFound, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB, sha256 verified)")


@models_app.command("list")
def models_list() -> None:
    """Known models and whether each is pulled."""
    from switchyard.engine.serving import registry

    for name, m in sorted(registry.KNOWN.items()):
        p = registry.models_dir() / m.filename
        typer.echo(f"{name:16} {'pulled' if p.exists() else 'not pulled':11} {m.description}")


@engine_app.command("serve")
def engine_serve(
    model: str = typer.Option("smollm2-135m", help="Known model name, a .gguf file, or an HF safetensors dir"),
    tp: int = typer.Option(1, help="Tensor-parallel ranks (SmolLM2: 1 or 3)"),
    collective: str = typer.Option("auto", help="ring | oneshot | auto"),
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8101),
    served_model_name: str = typer.Option("", help="Name in /v1/models (default: --model)"),
    max_num_seqs: int = typer.Option(16, help="Sequences decoded together (KV slots)"),
    max_model_len: int = typer.Option(
        0, help="Context length per sequence (0: the model's own window, e.g. 8192 for SmolLM2)"),
    max_waiting: int = typer.Option(256, help="Requests that may wait for a slot; beyond it: 429"),
    max_num_batched_tokens: int = typer.Option(
        512, help="Prompt tokens prefilled per step; longer prompts are prefilled in chunks between "
                  "decode steps (CPU engine; the GPU engine prefills whole prompts)"),
    dtype: str = typer.Option("auto", help="auto | float32 | bfloat16 | int4 (auto: int4 for 4-bit GGUF files)"),
    kv_cache_dtype: str = typer.Option(
        "auto", help="auto | float32 | float16 (CPU; auto: float16 with int4 weights, float32 with float32 weights)"),
    block_size: int = typer.Option(16, help="Positions per KV-cache block (a multiple of 16 keeps the CPU's native "
                                             "decode attention)"),
    num_kv_blocks: int = typer.Option(
        0, help="KV-cache blocks per rank (0: one sequence of --max-model-len plus --max-num-seqs - 1 of 2048 "
                "tokens); fewer means preemption under load, more keeps more prefixes cached"),
    prefix_caching: bool = typer.Option(True, "--prefix-caching/--no-prefix-caching",
                                        help="Reuse the KV blocks of prompts' common prefixes"),
    threads: int = typer.Option(0, help="Torch threads per rank (0: cores / local ranks)"),
    collective_timeout: float = typer.Option(10.0, help="Seconds before a stuck collective fails the replica"),
    device: str = typer.Option("cpu", help="cpu | cuda (bf16 weights and KV cache on the GPU; rank r uses GPU r)"),
    cuda_graphs: bool = typer.Option(True, "--cuda-graphs/--no-cuda-graphs",
                                     help="Replay decode steps as CUDA graphs (GPU only)"),
    decode_kernels: str = typer.Option(
        "auto", help="GPU steps on one rank: fused (decode steps of up to 16 rows as five Triton kernels a layer, "
                     "and the prefill's RoPE and SiLU in Triton; checked against torch at start-up and kept only "
                     "if they agree) | torch (its ops) | auto (fused on a GPU with triton)"),
    async_decode: bool = typer.Option(
        True, "--async-decode/--no-async-decode",
        help="GPU, one rank: launch each decode step before reading the previous step's tokens, its ids taken "
             "on the device, so the host's work overlaps the GPU's (steps that prefill, preempt, or run at TP > 1 "
             "stay synchronous)"),
    prefill_fp8: bool = typer.Option(
        False, "--prefill-fp8",
        help="GPU, one rank, the fused backend on an sm89+ GPU (Ada, Hopper): prefills of 4096 tokens or more run "
             "their projections in FP8 (weights with a scale per output row, activations with a scale per token, "
             "as vLLM's --quantization fp8), decode stays on the bf16 weights; costs an FP8 copy of the "
             "projections (about 7 GB for an 8B model)"),
    grammar_threads: int = typer.Option(
        0, help="Threads filling a step's grammar masks (structured output, tool calls); with more than one, "
                "each grammar is compiled for twice as many lanes (0: auto: up to 8, half the host's cores, on a "
                "GPU; 1 on a CPU)"),
    grammar_fill: str = typer.Option(
        "auto", help="Where the grammar masks are filled: thread (a thread of the engine's), process (a process "
                     "of their own, meeting the engine in shared memory: no GIL hand-overs), or auto (process on "
                     "a GPU, thread on a CPU)"),
    pin_cpus: str = typer.Option(
        "off", help="on (a GPU replica of one rank): the engine's loop thread on the first core of the CPUs it may "
                    "use and the grammar fill process on the others (three cores or more; replicas sharing a host "
                    "need CPUs of their own first: taskset, a container's cpuset); off: as the kernel places them"),
) -> None:
    """Serve a model over the OpenAI API, sharded over --tp ranks (also runs under torchrun)."""
    logging.basicConfig(level=os.environ.get("SWITCHYARD_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from switchyard.engine.errors import ConfigError
    from switchyard.engine.runner.options import EngineOptions
    from switchyard.engine.serving import launch, registry

    env_rank = launch.rank_from_env()
    try:
        opts = EngineOptions(
            model_path=registry.resolve(model), tp=env_rank[1] if env_rank else tp, collective=collective,
            max_num_seqs=max_num_seqs, max_model_len=max_model_len, max_waiting=max_waiting,
            max_num_batched_tokens=max_num_batched_tokens, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
            block_size=block_size, num_kv_blocks=num_kv_blocks, prefix_caching=prefix_caching, threads=threads,
            collective_timeout_s=collective_timeout, device=device, cuda_graphs=cuda_graphs,
            decode_kernels=decode_kernels, async_decode=async_decode, prefill_fp8=prefill_fp8,
            grammar_threads=grammar_threads, grammar_fill=grammar_fill, pin_cpus=pin_cpus)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None
    except (registry.ModelNotFound, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if device == "cpu":
        from switchyard.engine.backends.cpu.native import keep_workers_spinning

        keep_workers_spinning()  # before torch loads libgomp
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            typer.echo("error: --device cuda but this torch build sees no CUDA GPU", err=True)
            raise typer.Exit(2)
    try:
        if env_rank is None or env_rank[0] == 0:
            from switchyard.engine.model.weights import open_source

            open_source(opts.model_path).config.check_tp(opts.tp)
    except (ConfigError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if env_rank is None and tp > 1:
        raise typer.Exit(launch.supervise(launch.serve_argv(), tp))
    rank, world = env_rank if env_rank else (0, 1)
    if env_rank and tp not in (1, world):
        typer.echo(f"error: --tp {tp} but WORLD_SIZE={world}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(launch.run_rank(opts, served_model_name or model, rank, world, host, port))


if __name__ == "__main__":  # the engine alone, no gateway imports: python -m switchyard.engine.serving.cli --model ...
    engine_app()
