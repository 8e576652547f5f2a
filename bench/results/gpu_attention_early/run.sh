#!/usr/bin/env bash
# Issue #32: the paged decode attention loads its first tile's keys and values before its PDL wait (all but the
# newest position's, which the kernel before writes and which is read after the wait). shapes: SmolLM2's one-row
# step with the attention's (splits, positions a load) at the served pick and four others, kernels profiled, one
# process; ab: this tree's profile and tok/s against .before (a worktree of a18de7b, its tests, docs and results
# removed), each in its own process, alternated.
#
#   STAGES="shapes ab" bash bench/results/gpu_attention_early/run.sh   # carry .whl, .cache/smollm2-tokenizer, .before
#   STAGES="spans regress" OUT=... bash bench/results/gpu_attention_early/run.sh       # after the shape rule
#   STAGES="residual split kernels full" FULL_SHAPES=smollm2-135m OUT=... bash bench/results/gpu_attention_early/run.sh
#   STAGES="full" FULL_SHAPES=llama-8b OUT=... bash bench/results/gpu_attention_early/run.sh
#   STAGES="b64 kernels full" OUT=... bash bench/results/gpu_attention_early/run.sh   # after EARLY_TILE
#   STAGES="isolate full" OUT=... bash bench/results/gpu_attention_early/run.sh       # after _early's launch bound
#   STAGES="regress tools" OUT=... bash bench/results/gpu_attention_early/run.sh      # the final tree
#   STAGES=final OUT=... bash bench/results/gpu_attention_early/run.sh                 # prefill_kernels.rms_norm
#   STAGES=head OUT=... bash bench/results/gpu_attention_early/run.sh                  # next: argmax_kernel, head_gemv
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_attention_early  # out, PY, log, left, stage, regress
profile() {  # profile TREE NAME BATCH BACKENDS
  (cd "$1" && PYTHONPATH="$PWD" timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda_profile.py \
    --shape "${SHAPE:-smollm2-135m}" ${PROMPT:+--prompt $PROMPT} --batch "$3" --kernels 24 --backends "$4" --out "$out/prof_$2" >"$out/prof_$2.log" 2>&1)
  echo "profile $2 rc=$?" | tee -a "$log"; grep -hE "^## |steps:|attention" "$out/prof_$2"/kernels_*.md | head -n 40 | tee -a "$log"
}
for s in ${STAGES:-shapes ab}; do
  case $s in
    shapes) stage shapes
      profile . shapes 1 cuda,cuda-attention-4x64,cuda-attention-2x128,cuda-attention-1x128,cuda-attention-1x256,cuda ;;
    ab) stage ab
      for r in $(seq "${AB_ROUNDS:-2}"); do
        for tree in . .before; do
          name=$([ "$tree" = . ] && echo this || echo before)
          [ "$(left)" -lt 60 ] && { echo "ab round $r $name: skipped (time)" | tee -a "$log"; continue; }
          profile "$tree" "${name}_$r" 1 cuda
          (cd "$tree" && PYTHONPATH="$PWD" timeout "$(( $(left) < 100 ? $(left) - 5 : 100 ))" $PY bench/engine_cuda.py \
            --shapes smollm2-135m --batches 1,16 --tokens 64 --skip-transformers --peer-batches= --ttft= --budget-s 90 \
            --out "$out/ab_${name}_$r" >"$out/ab_${name}_$r.log" 2>&1)
          echo "ab round $r $name rc=$?" | tee -a "$log"; grep -E "^\|" "$out/ab_${name}_$r/engine_cuda.md" | tail -n 6 | tee -a "$log"
        done
      done ;;
    spans) stage spans  # the served shapes (after call 1) against the picks before, at spans 256 and 512
      SHAPE=smollm2-135m PROMPT=128 profile . s256_b1 1 cuda,cuda-attention-8x32,cuda,cuda-attention-8x32
      SHAPE=smollm2-135m PROMPT=400 profile . s512_b1 1 cuda,cuda-attention-16x32,cuda,cuda-attention-16x32
      SHAPE=smollm2-135m PROMPT=128 profile . s256_b16 16 cuda,cuda-attention-8x32,cuda,cuda-attention-8x32
      SHAPE=llama-8b PROMPT=128 profile . 8b_s256_b1 1 cuda,cuda-attention-8x32,cuda,cuda-attention-8x32 ;;
    residual) stage residual  # o_proj's and down_proj's residual loaded before their wait, or after (as before)
      profile . res_b1 1 cuda,cuda-late-residual,cuda,cuda-late-residual
      profile . res_b16 16 cuda,cuda-late-residual,cuda,cuda-late-residual ;;
    b64) stage b64  # 64 rows: the first tile before the wait at every shape, or as served (after it past EARLY_TILE)
      SHAPE=llama-8b profile . 8b_b64 64 cuda,cuda-attention-early,cuda,cuda-attention-early
      profile . s_b64 64 cuda,cuda-attention-late,cuda,cuda-attention-late ;;
    isolate) stage isolate  # the served rule (early up to 256 programs of up to 8,192 elements) against late, alone
      SHAPE=llama-8b profile . 8b_b1_late 1 cuda,cuda-attention-late,cuda,cuda-attention-late
      profile . s_b1_late 1 cuda,cuda-attention-late,cuda,cuda-attention-late
      profile . s_b16_late 16 cuda,cuda-attention-late,cuda,cuda-attention-late ;;
    split) stage split  # the host's turn by part at batch 1, free
      timeout 100 $PY bench/engine_cuda_profile.py --batch 1 --tokens 1000 --host-split free --rounds 2 \
        >"$out/split_b1.md" 2>&1
      echo "split rc=$?" | tee -a "$log"; grep -E "^## |tok/s|runner|graph|wait|download|output|sampling" "$out/split_b1.md" | tee -a "$log" ;;
    kernels) stage kernels  # the kernel GPU tests alone (the PDL chain's among them)
      timeout "$(( $(left) - 5 ))" $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_kernels.py tests/engine/test_cuda.py \
        >"$out/kernel_tests.log" 2>&1
      echo "kernels rc=$?" | tee -a "$log"; tail -n 2 "$out/kernel_tests.log" | tee -a "$log" ;;
    tools) stage tools  # SmolLM2 free, under the items grammar and under the tool-call grammar, 3 rounds
      timeout 150 $PY bench/engine_cuda.py --shapes smollm2-135m --batches 1,16 --grammar-batches 1,16 --grammar-rounds 3 \
        --grammar-tools --tokens 64 --skip-transformers --peer-batches= --ttft= --budget-s 140 --out "$out/tools" \
        >"$out/tools.log" 2>&1
      echo "tools rc=$?" | tee -a "$log"; grep -E "^\|" "$out/tools/engine_cuda.md" | tail -n 8 | tee -a "$log" ;;
    final) stage final  # a fused step's final RMSNorm in one Triton kernel against torch's six
      profile . final_b1 1 cuda,cuda-torch-final,cuda,cuda-torch-final
      timeout "$(( $(left) - 5 ))" $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_kernels.py tests/engine/test_cuda.py \
        >"$out/kernel_tests.log" 2>&1
      echo "kernels rc=$?" | tee -a "$log"; tail -n 2 "$out/kernel_tests.log" | tee -a "$log" ;;
    head) stage head  # candidates written after call 8: a many-program argmax; the LM head's norm + GEMV in one kernel
      timeout 120 $PY bench/argmax_kernel.py --rows 1,16,64 --vocab 49152,128256 >"$out/argmax.md" 2>&1
      echo "argmax rc=$?" | tee -a "$log"; tee -a "$log" <"$out/argmax.md"
      timeout 120 $PY bench/head_gemv.py --shapes 49152x576,128256x4096 --rows 1,16 >"$out/head_gemv.md" 2>&1
      echo "head_gemv rc=$?" | tee -a "$log"; tee -a "$log" <"$out/head_gemv.md" ;;
    regress) regress ;;
    full) BATCHES=1,16,64 engine_bench "${FULL_SHAPES:-smollm2-135m,llama-8b}" 1,16 ;;
  esac
done
pack  # everything in $out/all.tgz
