"""The GPU decode kernels compile for an H200 (sm90) with programmatic dependent launch, on a
machine without a GPU: Triton's own compiler and ptxas, no device. The CPU tests run the kernels
in Triton's interpreter, which takes code the compiler refuses (a module constant read in a
kernel, an instruction the interpreter skips); this catches that before a GPU run does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="the kernels need triton (dev extra)")

SCRIPT = textwrap.dedent('''
    import torch
    torch.cuda.is_available = lambda: True  # compile, do not interpret (triton_common reads this)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from switchyard.engine.backends.cuda import head_kernels as hk, kernels as ck, paged_attention as pa

    def compile(fn, sig, consts):
        sig = dict(sig) | {k: "constexpr" for k in consts}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                       options={"launch_pdl": True})
        print("compiled", fn.__name__, sorted(consts.items()))

    bf, f32, i64 = "*bf16", "*fp32", "*i64"
    compile(hk._chunk_top_kernel, {"raw_ptr": bf, "out_ptr": f32, "keys_ptr": i64, "V": "i32"},
            {"CHUNK": 2048, "K": 32, "PDL": True})
    compile(hk._refine_kernel, {"keys_ptr": i64, "w_ptr": f32, "h_ptr": f32, "out_ptr": f32, "V": "i32", "HID": "i32",
            "NK": "i32"}, {"K": 32, "NK_P": 1024, "BLOCK": 1024, "PDL": True})
    att = {"q_ptr": bf, "kc_ptr": bf, "vc_ptr": bf, "tables_ptr": i64, "stride_t": "i32", "ctx_ptr": i64, "o_ptr": bf,
           "mo_ptr": f32, "ml_ptr": f32, "cnt_ptr": "*i32", "sm_scale": "fp32"}
    for splits in (1, 8):
        compile(pa._attention_kernel, att, {"H": 9, "HKV": 3, "D": 64, "BS": 16, "GP": 16, "CHUNK": 32, "BLOCK_N": 32,
                "SPLITS": splits, "UPCAST": False, "PDL": True})
    for m_p in (1, 16):
        compile(ck._qkv_rope_kernel, {"x_ptr": f32, "stride_x": "i32", "ln_ptr": f32, "w_ptr": bf, "b_ptr": bf,
                "qkn_ptr": f32, "cos_ptr": f32, "sin_ptr": f32, "pos_ptr": i64, "blk_ptr": i64, "off_ptr": i64,
                "q_ptr": bf, "kc_ptr": bf, "vc_ptr": bf, "M": "i32", "K": "i32", "eps": "fp32", "qk_eps": "fp32"},
                {"H": 9, "HKV": 3, "D": 64, "BS": 16, "R": 2, "M_P": m_p, "BLOCK_K": 1024, "NORM_BLOCK": 1024,
                 "PREFETCH": m_p == 1, "HAS_BIAS": False, "QK_NORM": False, "UPCAST": False, "PDL": True})
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
''')


def test_decode_kernels_compile_for_sm90_with_pdl() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("compiled") == 11, r.stdout
