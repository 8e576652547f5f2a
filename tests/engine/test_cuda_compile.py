"""The GPU decode kernels (and the sampler's argmax, the final norm) compile for an H200 (sm90) with programmatic
dependent launch (the grammar mask, waiting or not, without), and the persistent one-row kernel with its barriers (bench/persistent_kernel.py) and
the one-kernel refinement (bench/chunk_refine.py), on a machine without a GPU: Triton's own compiler and ptxas, no device. The CPU tests run the kernels
in Triton's interpreter, which takes code the compiler refuses (a module constant read in a
kernel, an instruction the interpreter skips); this catches that before a GPU run does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels need triton (dev extra)")

SCRIPT = textwrap.dedent('''
    import torch
    torch.cuda.is_available = lambda: True  # compile, do not interpret (triton_common reads this)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from switchyard.engine.backends.base import ModelDims
    from switchyard.engine.backends.cuda import head_kernels as hk, kernels as ck, paged_attention as pa
    from switchyard.engine.backends.cuda import prefill_kernels as pk, token_mask as tm
    import persistent_kernel as persistent  # bench/: the persistent one-row kernel, a bench variant
    import chunk_refine  # bench/: the refinement in one kernel, a candidate


    def compile(fn, sig, consts, **options):
        sig = dict(sig) | {k: "constexpr" for k in consts}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options={"launch_pdl": True, **options})
        print("compiled", fn.__name__, sorted(consts.items()))

    bf, f32, i64 = "*bf16", "*fp32", "*i64"
    compile(hk._chunk_top_kernel, {"raw_ptr": bf, "out_ptr": f32, "keys_ptr": i64, "V": "i32"},
            {"CHUNK": 2048, "K": 32, "PDL": True})
    compile(hk._refine_kernel, {"keys_ptr": i64, "w_ptr": f32, "h_ptr": f32, "out_ptr": f32, "V": "i32", "HID": "i32",
            "NK": "i32"}, {"K": 32, "NK_P": 1024, "BLOCK": 1024, "PDL": True})
    for low in (False, True):  # a fused step's final norm, with the LM head's bf16 input beside it or not
        compile(pk._add_rms_kernel, {"x_ptr": f32, "y_ptr": f32, "w_ptr": f32, "xo_ptr": f32, "h_ptr": f32,
                "lo_ptr": bf if low else f32, "N": "i32", "eps": "fp32"}, {"BLOCK": 1024, "ADD": False, "LOW": low},
                launch_pdl=False)
    compile(hk._argmax_kernel, {"x_ptr": f32, "stride_x": "i32", "V": "i32", "keys_ptr": i64, "cnt_ptr": "*i32",
            "out_ptr": i64}, {"CHUNK": 2048, "CHUNKS_P": 64}, num_warps=8)
    compile(tm._bitmask_kernel, {"logits_ptr": f32, "stride_l": "i32", "bm_ptr": "*i32", "words": "i32",
            "rows_ptr": i64, "V": "i32"}, {"BLOCK": 2048, "ROWS": True}, launch_pdl=False)  # the grammar mask
    compile(tm._wait_kernel, {"flag_ptr": i64, "ticket": "i32", "spins": "i32"}, {"SYS": True}, launch_pdl=False,
            num_warps=1)  # and its wait for bits filled ahead (system-scope loads)
    compile(chunk_refine._chunk_refine_kernel, {"raw_ptr": bf, "w_ptr": f32, "h_ptr": f32, "out_ptr": f32, "V": "i32",
            "HID": "i32"}, {"CHUNK": 2048, "K": 32, "BLOCK_H": 128, "PDL": True}, num_warps=8)
    att = {"q_ptr": bf, "kc_ptr": bf, "vc_ptr": bf, "tables_ptr": i64, "stride_t": "i32", "ctx_ptr": i64, "o_ptr": bf,
           "mo_ptr": f32, "ml_ptr": f32, "cnt_ptr": "*i32", "sm_scale": "fp32"}
    for splits in (1, 8):
        compile(pa._attention_kernel, att, {"H": 9, "HKV": 3, "D": 64, "BS": 16, "GP": 16, "CHUNK": 32, "BLOCK_N": 32,
                "SPLITS": splits, "UPCAST": False, "PDL": True})
    for m_p in (1, 16):
        compile(ck._qkv_rope_kernel, {"x_ptr": f32, "stride_x": "i32", "ln_ptr": f32, "w_ptr": bf, "b_ptr": bf,
                "qkn_ptr": f32, "cos_ptr": f32, "sin_ptr": f32, "pos_ptr": i64, "blk_ptr": i64, "off_ptr": i64,
                "q_ptr": bf, "kc_ptr": bf, "vc_ptr": bf, "M": "i32", "K": "i32", "eps": "fp32", "qk_eps": "fp32",
                "tab_stride": "i32"},
                {"H": 9, "HKV": 3, "D": 64, "BS": 16, "R": 2, "M_P": m_p, "BLOCK_K": 1024, "NORM_BLOCK": 1024,
                 "PREFETCH": m_p == 1, "HAS_BIAS": False, "QK_NORM": False, "UPCAST": False, "TABLES": m_p == 1,
                 "PDL": True})
        compile(ck._gemv_residual_kernel, {"a_ptr": bf, "w_ptr": bf, "x_ptr": f32, "out_ptr": f32, "M": "i32",
                "N": "i32", "K": "i32"}, {"R": 2 if m_p == 1 else 32, "M_P": m_p, "BLOCK_K": 1024 if m_p == 1 else 256,
                "PREFETCH": m_p == 1, "UPCAST": False, "PDL": True})
        compile(ck._gate_up_silu_kernel, {"x_ptr": f32, "ln_ptr": f32, "w_ptr": bf, "out_ptr": bf, "M": "i32",
                "INTER": "i32", "K": "i32", "eps": "fp32"}, {"R": 4 if m_p == 1 else 16, "M_P": m_p,
                "BLOCK_K": 1024 if m_p == 1 else 256, "NORM_BLOCK": 1024, "PREFETCH": m_p == 1, "UPCAST": False,
                "PDL": True})
    compile(ck._rope_write_kernel, {"qkv_ptr": bf, "qkn_ptr": f32, "cos_ptr": f32, "sin_ptr": f32, "pos_ptr": i64,
            "blk_ptr": i64, "off_ptr": i64, "q_ptr": bf, "kc_ptr": bf, "vc_ptr": bf, "M": "i32", "qk_eps": "fp32"},
            {"H": 9, "HKV": 3, "D": 64, "BS": 16, "BLOCK_M": 16, "QK_NORM": False, "PDL": True})
    # the persistent one-row kernel at SmolLM2's shape on 132 multiprocessors, with its barriers
    dims = ModelDims(9, 3, 64, 576, 1e-5, 1, torch.device("cpu"), torch.bfloat16, 16, 64, 256, None, None, None)
    s = persistent.shape_for(dims, 1536, 132)
    layers_sig = {n: bf for n in ("wqkv_ptr", "wo_ptr", "wgu_ptr", "wd_ptr", "kc_ptr", "vc_ptr", "q_ptr", "h_ptr")}
    layers_sig |= {n: f32 for n in ("x_ptr", "ln1_ptr", "ln2_ptr", "cos_ptr", "sin_ptr", "mo_ptr", "ml_ptr")}
    layers_sig |= {n: i64 for n in ("offs_ptr", "pos_ptr", "blk_ptr", "off_ptr", "table_ptr", "ctx_ptr")}
    layers_sig |= {"bar_ptr": "*i32", "times_ptr": "*i64", "chunk": "i32", "eps": "fp32", "sm_scale": "fp32", "layer_lo": "i32",
                   "layer_hi": "i32", "only": "i32", "budget": "i32"}
    compile(persistent._layers_kernel, layers_sig, dict(HID=576, HP=1024, INTER=1536, H=9, HKV=3, D=64, BS=16, GP=16,
            RQ=s.rq, BKQ=s.bkq, RO=s.ro, HG=s.hg, RG=s.rg, BKG=s.bkg, RD=s.rd, BKD=s.bkd, NPROG=132, SPLITS=4,
            BLOCK_N=64, UPCAST=False, SYNC=True), num_warps=s.warps)
''')


def test_decode_kernels_compile_for_sm90_with_pdl() -> None:
    bench = str(Path(__file__).resolve().parents[2] / "bench")
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (bench, os.environ.get("PYTHONPATH", "")) if p)}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("compiled") == 18, r.stdout
