#!/usr/bin/env bash
# Issue #32: on an H100 the compiled PyTorch peer ran the 8B shape 5-6% faster than ours at batch 16 and 64
# (bench/results/gpu_host_cuts/out/full). A decode step's kernels, ours and the peer's, at those batches.
#
#   bash bench/results/gpu_peer_8b/run.sh   # carry .whl, .cache/smollm2-tokenizer
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_peer_8b  # out, PY, log, left, stage
for b in ${BATCHES:-16 64}; do
  stage "b$b"
  timeout "$(( $(left) < 240 ? $(left) - 5 : 240 ))" $PY bench/engine_cuda_profile.py --shape llama-8b --batch "$b" \
    --kernels 12 --backends auto,peer --out "$out" >"$out/b$b.log" 2>&1
  echo "b$b rc=$?" | tee -a "$log"
done
stage done
