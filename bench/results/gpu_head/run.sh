#!/usr/bin/env bash
# Issue #32, the end of a decode step: the greedy rows' argmax in one Triton launch (head_kernels.RowArgmax)
# against torch's, the LM head's norm + GEMV in one kernel at several tiles against the served three launches,
# and the decode step captured in 1, 2 or 4 graphs (graph_runner.GRAPH_PARTS). One device call a line:
#
#   STAGES="head ab kernels" OUT=$OUT bash bench/results/gpu_head/run.sh   # carry .whl, .cache/smollm2-tokenizer
#   STAGES="parts regress" OUT=$OUT bash bench/results/gpu_head/run.sh
#   STAGES="full regress parts" PARTS_ROUNDS=3 OUT=$OUT bash bench/results/gpu_head/run.sh   # GRAPH_PARTS = 1
#   STAGES=final OUT=$OUT bash bench/results/gpu_head/run.sh
#   STAGES=tiles OUT=$OUT bash bench/results/gpu_head/run.sh                                     # one-row tiles
#   STAGES="refine full" FULL_SHAPES=smollm2-135m OUT=$OUT bash bench/results/gpu_head/run.sh   # call 9: bench/chunk_refine.py
#
# Everything lands in $OUT/all.tgz (one file back); progress in its run.log.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_head  # out, PY, log, left, stage, regress, engine_bench
profile() {  # profile NAME BATCH BACKENDS ($SHAPE, default SmolLM2's)
  timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda_profile.py --shape "${SHAPE:-smollm2-135m}" \
    --batch "$2" --kernels 24 --backends "$3" --out "$out/prof_$1" >"$out/prof_$1.log" 2>&1
  echo "profile $1 rc=$?" | tee -a "$log"
  grep -hE "^## |steps:|nvjet|reduce_kernel|_argmax|_refine|_chunk_top" "$out/prof_$1"/kernels_*.md | tee -a "$log"
}
sweep() {  # sweep NAME BACKENDS ROUNDS: SmolLM2's one-row step by each backend in turn, each one's median step
  timeout "$(( $(left) - 5 ))" $PY bench/engine_cuda.py --shapes smollm2-135m --batches 1 --tokens 120 --skip-transformers \
    --peer-batches= --ttft= --grammar-batches= --sweep --sweep-batches 1 --sweep-backends "$2" --parts-batches= \
    --sweep-rounds "$3" --budget-s "$(( $(left) - 10 ))" --out "$out/$1" >"$out/$1.log" 2>&1
  echo "$1 rc=$?" | tee -a "$log"; grep -E "median of" "$out/$1/engine_cuda.log" | tee -a "$log"
}
for s in ${STAGES:-head ab kernels}; do
  case $s in
    head) stage head  # bench/head_gemv.py was removed after call 2 (it lost): commit 77ecba2 has it
      timeout 100 $PY bench/argmax_kernel.py --rows 1,16,64 --vocab 49152,128256 >"$out/argmax.md" 2>&1
      echo "argmax rc=$?" | tee -a "$log"; tee -a "$log" <"$out/argmax.md"
      timeout 150 $PY bench/head_gemv.py --shapes 49152x576,128256x4096 --rows 1 \
        --tiles 8x1024x4,16x1024x4,16x1024x8,32x1024x8,32x512x4,64x256x4,64x256x8,128x128x8,64x64x4,256x64x8 \
        >"$out/head_gemv.md" 2>&1
      echo "head_gemv rc=$?" | tee -a "$log"; tee -a "$log" <"$out/head_gemv.md" ;;
    ab) stage ab  # the served step against torch's argmax and other graph parts, alternated in one process each
      profile s_b1 1 cuda,cuda+torch-argmax,cuda@1,cuda@2,cuda,cuda+torch-argmax,cuda@1,cuda@2
      profile s_b16 16 cuda,cuda+torch-argmax,cuda@1,cuda,cuda+torch-argmax,cuda@1
      SHAPE=llama-8b profile 8b_b1 1 cuda,cuda+torch-argmax,cuda@1,cuda,cuda+torch-argmax,cuda@1 ;;
    kernels) stage kernels  # the kernel GPU tests (the argmax's and the mask's handles among them)
      timeout "$(( $(left) - 5 ))" $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_kernels.py tests/engine/test_cuda.py \
        >"$out/kernel_tests.log" 2>&1
      echo "kernels rc=$?" | tee -a "$log"; tail -n 2 "$out/kernel_tests.log" | tee -a "$log" ;;
    parts) stage parts  # the step in 1 graph against 4 (served), alternated, 5 rounds, each the median
      timeout "$(( $(left) - 5 ))" $PY bench/engine_cuda.py --shapes smollm2-135m,llama-8b --batches 1 --tokens 120 --skip-transformers \
        --peer-batches= --ttft= --grammar-batches= --sweep --sweep-batches 1 --sweep-backends cuda --parts-batches 1,16,64 \
        --sweep-rounds "${PARTS_ROUNDS:-5}" --budget-s "$(( $(left) - 10 ))" --out "$out/parts" >"$out/parts.log" 2>&1
      echo "parts rc=$?" | tee -a "$log"; grep -iE "parts|^\| (smollm2|llama)" "$out/parts/engine_cuda.md" | tail -n 12 | tee -a "$log" ;;
    final) stage final  # the final tree's step against this session's start (4 graphs, torch's argmax); the mended test
      profile s_final_b1 1 cuda,cuda+torch-argmax@4,cuda,cuda+torch-argmax@4
      timeout 120 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py -k "matches_cpu_engine_with_and_without_graphs" \
        >"$out/graphs_test.log" 2>&1
      echo "graphs test rc=$?" | tee -a "$log"; tail -n 1 "$out/graphs_test.log" | tee -a "$log" ;;
    tiles) stage tiles  # SmolLM2's one-row kernels at other tiles and warps (engine_cuda_variants.ONE_ROW_TILES), alternated
      backends=cuda$($PY -c "import sys; sys.path.insert(0, 'bench'); import engine_cuda_variants as v; print(''.join(',cuda-1row-' + t for t in v.ONE_ROW_TILES))")
      sweep tiles "${TILES:-$backends}" "${TILE_ROUNDS:-5}" ;;
    refine) stage refine  # the refinement in one kernel (bench/chunk_refine.py), alone and in the step (call 9: not served)
      timeout 100 $PY bench/chunk_refine.py --shapes 49152x576,128256x4096 --rows 1,16 >"$out/chunk_refine.md" 2>&1
      echo "chunk_refine rc=$?" | tee -a "$log"; tee -a "$log" <"$out/chunk_refine.md"
      sweep refine cuda,cuda-chunk-refine 9
      profile refine_b1 1 cuda,cuda-chunk-refine,cuda,cuda-chunk-refine ;;
    regress) regress ;;
    full) BATCHES=1,16,64 engine_bench "${FULL_SHAPES:-smollm2-135m,llama-8b}" 1,16 ;;
  esac
done
pack  # everything in $out/all.tgz
