#!/usr/bin/env bash
# Issue #32, SmolLM2's batch-1 step (goal 2,500 tok/s, 0.40 ms): a one-row step's small launches cut, and the
# grammar masks filled ahead served (chat/grammar.GrammarMasker.AHEAD). The cuts: the fused QKV kernel reads each
# row's KV slot from its block table (kernels.qkv_rope(tables=)), not from torch's division, gather and remainder
# once a step; the LM head's refinement writes the logits into the graph's output (head_kernels.refine(out=)),
# without a copy after it. Bench backends undo them (engine_cuda_variants: cuda-torch-slots, cuda-logits-copy,
# cuda-step-before: both). Call 2's cuts: the final norm writes the LM head's bf16 input too (undone:
# cuda-head-cast), and the scheduler takes the step's logits as a view of the graph's output, not a copy
# (undone: NAME+copied-logits; cuda-step-before+copied-logits undoes every cut).
#
#   STAGES="sweep profile ab regress" OUT=$OUT bash bench/results/gpu_step_cuts/run.sh   # call 1; carry .whl, .cache/smollm2-tokenizer
#   TOOLS=1 STAGES="tests sweep2 full pools" OUT=$OUT bash bench/results/gpu_step_cuts/run.sh   # call 2
#   TOOLS=1 STAGES="ab ..." OUT=$OUT bash bench/results/gpu_step_cuts/run.sh   # call 3: the fill pool served (its
#   tree's run.sh also had a "gtests" stage, a pytest -k selection of test_cuda_serve, test_structured,
#   test_async_decode and test_cuda that took CPU-only tests too: use regress; see the README)
#
# sweep:   SmolLM2's one-row step by each backend in turn ($SWEEP_ROUNDS rounds, each one's median), then the 8B's;
# profile: the kernels of a SmolLM2 batch-1 step, served / before, alternated, with one step's launches in order;
# ab:      grammar / free at batch 1 and 16 (SmolLM2's and the 8B's shape), the masks filled ahead (served) against
#          in line, and (call 3) against one fill thread, alternated (bench/engine_cuda.py --grammar-ab);
# regress: every GPU test; full: ours and the compiled peer ($FULL_SHAPES) at 1, 16, 64 (TOOLS=1: the tool-call
#          grammar's rows too); pools: SmolLM2 batch 16 under the grammar, the fill thread handing the rows to
#          llguidance's pool of $POOLS threads (copies of one grammar, and a grammar compiled per thread).
# Everything lands in $OUT/all.tgz (one file back); progress in its run.log.
cd "$(dirname "$0")/../../.."
. bench/device_env.sh gpu_step_cuts  # out, PY, log, left, stage, regress, engine_bench, pack
sweep() {  # sweep NAME SHAPE BACKENDS ROUNDS: a one-row step by each backend in turn, each one's median step
  timeout "$(( $(left) - 5 ))" $PY bench/engine_cuda.py --shapes "$2" --batches 1 --tokens 120 --skip-transformers \
    --peer-batches= --ttft= --grammar-batches= --sweep --sweep-batches 1 --sweep-backends "$3" --parts-batches= \
    --sweep-rounds "$4" --budget-s "$(( $(left) - 10 ))" --out "$out/$1" >"$out/$1.log" 2>&1
  echo "$1 rc=$?" | tee -a "$log"; grep -E "median of" "$out/$1/engine_cuda.log" | tee -a "$log"
}
for s in ${STAGES:-sweep profile ab regress}; do
  case $s in
    sweep) stage sweep
      sweep sweep_s smollm2-135m cuda,cuda-step-before,cuda-torch-slots,cuda-logits-copy "${SWEEP_ROUNDS:-7}"
      sweep sweep_8b llama-8b cuda,cuda-step-before 3 ;;
    sweep2) stage sweep2
      sweep sweep2_s smollm2-135m cuda,cuda-step-before+copied-logits,cuda+copied-logits,cuda-head-cast "${SWEEP_ROUNDS:-7}" ;;
    profile) stage profile
      timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda_profile.py --shape smollm2-135m \
        --batch 1 --kernels 24 --backends cuda,cuda-step-before,cuda,cuda-step-before --out "$out/prof_b1" >"$out/prof_b1.log" 2>&1
      echo "profile rc=$?" | tee -a "$log"; grep -hE "^## |steps:" "$out/prof_b1"/kernels_*.md | tee -a "$log" ;;
    ab) stage ab
      timeout "$(( $(left) < 200 ? $(left) - 5 : 200 ))" $PY bench/engine_cuda.py --shapes smollm2-135m,llama-8b \
        --batches= --grammar-batches 1,16 --grammar-rounds 3 --grammar-ab ${TOOLS:+--grammar-tools} --tokens 64 \
        --skip-transformers --peer-batches= --ttft= --budget-s 190 --out "$out/ab" >"$out/ab.log" 2>&1
      echo "ab rc=$?" | tee -a "$log"; grep -E "^\| (smollm2|llama)" "$out/ab/engine_cuda.md" | tail -n 8 | tee -a "$log" ;;
    tests) stage tests  # the GPU tests of what call 2's cuts touch (a short budget's regress)
      timeout "$(( $(left) - 5 ))" $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda_kernels.py \
        tests/engine/test_cuda.py tests/engine/test_async_decode.py -k "add_rms or refine or qkv_rope or fused or graphs" \
        >"$out/tests.log" 2>&1
      echo "tests rc=$?" | tee -a "$log"; tail -n 2 "$out/tests.log" | tee -a "$log" ;;
    pools) stage pools  # SmolLM2 batch 16 under the items grammar: the fill thread handing the rows to a pool
      timeout "$(( $(left) < 150 ? $(left) - 5 : 150 ))" $PY bench/engine_cuda.py --shapes smollm2-135m --batches= \
        --grammar-batches 16 --grammar-rounds 3 --mask-threads-ab "${POOLS:-2,4,8}" --tokens 64 --skip-transformers \
        --peer-batches= --ttft= --parts-batches= --budget-s 140 --out "$out/pools" >"$out/pools.log" 2>&1
      echo "pools rc=$?" | tee -a "$log"; grep -E "^\| smollm2" "$out/pools/engine_cuda.md" | tail -n 8 | tee -a "$log" ;;
    regress) regress ;;
    full) BATCHES=1,16,64 engine_bench "${FULL_SHAPES:-smollm2-135m,llama-8b}" 1,16 ;;
  esac
done
pack  # everything in $out/all.tgz
