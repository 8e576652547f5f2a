#!/usr/bin/env bash
# The engine's GPU checks in one command, on a machine with one CUDA GPU (an H200 so far):
#
#   bash bench/gpu_check.sh [all|tests|bench|sweep]  # all: the tests, then the bench
#   bash bench/gpu_check.sh prepare                # here, before: SmolLM2's tokenizer into .cache/
#
# tests: tests/engine/test_cuda*.py (the GPU decoder against the CPU engine, the Triton kernels
#        compiled, `engine serve --device cuda`, TP=2 where two GPUs are), the GPU half of
#        tests/engine/test_structured.py (the grammar's masks on the device) and of
#        tests/engine/test_async_decode.py (async decode equals sync in CUDA graphs), -rs: what skipped, why.
# bench: bench/engine_cuda.py --batches 1,16,64 --tokens 64 --grammar-batches 1,16 for the 8B and
#        SmolLM2 shapes (random bf16 weights; the served loop with async decode and without, masks
#        on at 1 and 16; ours against transformers' generate, TTFT of 1k and 8k prompts).
# sweep: bench/engine_cuda_sweep.py (the decode backends and their variants at 1..64 rows, graph parts 1 vs 4; both shapes).
#
# Logs and results go to $OUT when it is set (a device run's folder that comes back), else to
# bench/results/gpu_check/: gpu_tests.log, engine_cuda.{log,csv,md}, gpu_check.txt (what ran,
# exit codes). The tests need SmolLM2's tokenizer files where its GGUF is not cached (a device
# machine): `prepare` writes them to .cache/smollm2-tokenizer/ (git ignores .cache/), which the run
# carries; the script points SWITCHYARD_TEST_TOKENIZER_DIR at them when that folder exists.
# The whole of `all` took about 2 minutes of tests and 7 of bench on one H200 before (see
# bench/results/engine_cuda_tests.log and engine_cuda.md); run `tests` and `bench` as two calls
# where one call may last at most 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
tok_dir=.cache/smollm2-tokenizer

if [ "$what" = prepare ]; then
    mkdir -p "$tok_dir"
    "$PY" -c "
import sys; from pathlib import Path; sys.path[:0] = ['tests', 'tests/engine']
from test_cuda_serve import write_tokenizer
write_tokenizer(Path('$tok_dir'))" && echo "wrote $tok_dir (carry it: .cache/smollm2-tokenizer)"
    exit $?
fi

out=${OUT:-bench/results/gpu_check}
mkdir -p "$out"
if [ -z "${SWITCHYARD_TEST_TOKENIZER_DIR:-}" ] && [ -f "$tok_dir/tokenizer.json" ]; then
    export SWITCHYARD_TEST_TOKENIZER_DIR="$PWD/$tok_dir"
fi
summary="$out/gpu_check.txt"
{ date -u; git rev-parse --short HEAD 2>/dev/null; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } >"$summary" 2>&1
rc=0

if [ "$what" = all ] || [ "$what" = tests ]; then
    "$PY" -m pytest -q -p no:cacheprovider -rs --durations=15 \
        tests/engine/test_cuda*.py \
        "tests/engine/test_structured.py::test_gpu_masks_equal_the_cpu_kernel" \
        "tests/engine/test_grammar_process.py::test_gpu_fill_processes_one_after_another_mask_as_the_cpu_does" \
        "tests/engine/test_async_decode.py::test_gpu_async_equals_sync_in_graphs" 2>&1 | tee "$out/gpu_tests.log"
    t=${PIPESTATUS[0]}
    echo "tests: exit $t; $(tail -n 1 "$out/gpu_tests.log")" >>"$summary"
    [ "$t" -eq 0 ] || rc=$t
fi

if [ "$what" = sweep ]; then
    "$PY" bench/engine_cuda_sweep.py --out "$out" 2>&1 | tail -n 30
    b=${PIPESTATUS[0]}
    echo "sweep: exit $b (engine_cuda_sweep.md, .csv, .log)" >>"$summary"
    [ "$b" -eq 0 ] || rc=$b
fi

if [ "$what" = all ] || [ "$what" = bench ]; then
    "$PY" bench/engine_cuda.py --shapes llama-8b,smollm2-135m --batches 1,16,64 --tokens 64 --budget-s 400 \
        --grammar-batches 1,16 --out "$out" 2>&1 | tail -n 40
    b=${PIPESTATUS[0]}
    echo "bench: exit $b (engine_cuda.md, .csv, .log)" >>"$summary"
    [ "$b" -eq 0 ] || rc=$b
fi
cat "$summary"
exit $rc
