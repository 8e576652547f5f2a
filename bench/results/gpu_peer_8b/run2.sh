#!/usr/bin/env bash
# Issue #32, after gpu_peer_8b's profiles: the decode glue past the fused rows (residual add + RMSNorm,
# SiLU * up) in Triton kernels (prefill_kernels.add_rms, silu_mul) against torch's compiled dynamic-shape
# ops (the bench backend cuda-compiled-glue), alternated in rounds, beside the compiled peer; then the
# GPU tests that run those kernels (test_cuda.py, test_cuda_kernels.py).
#
#   DEADLINE=300 bash bench/results/gpu_peer_8b/run2.sh   # carry .whl, .cache/smollm2-tokenizer
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_peer_8b  # out, PY, log, left, stage
stage sweep
timeout 130 $PY bench/engine_cuda.py --shapes llama-8b,smollm2-135m --batches 16,64 --peer-batches 16,64 --tokens 64 \
  --ttft= --skip-transformers --sweep --sweep-backends cuda,cuda-compiled-glue --sweep-batches 16,64 \
  --parts-batches= --sweep-rounds 3 --budget-s 125 --out "$out" >"$out/sweep.log" 2>&1
echo "sweep rc=$?" | tee -a "$log"; grep -E "^\|" "$out/engine_cuda.md" | tee -a "$log"
stage tests
timeout "$(( $(left) - 5 ))" $PY -m pytest -q -p no:cacheprovider -rs tests/engine/test_cuda.py \
  tests/engine/test_cuda_kernels.py >"$out/tests.log" 2>&1
echo "tests rc=$?" | tee -a "$log"; tail -n 4 "$out/tests.log" | tee -a "$log"
stage done
