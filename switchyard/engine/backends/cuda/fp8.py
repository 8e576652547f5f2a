"""FP8 projections for long prefills (`--prefill-fp8`), as vLLM's `--quantization fp8` runs them
but for the prefill only: decode keeps the bf16 weights and the fused kernels.

An 8k-token prefill of an 8B model is its projections' GEMMs (~160 of 229 ms in bf16 on an H200,
at ~715 TFLOPS), and Hopper's FP8 tensor cores run twice bf16's rate. So each dense projection
also gets an FP8 copy at load (`attach`): float8_e4m3fn weights with one float32 scale per output
row (amax / 448), 1 byte a weight (7.0 GB for an 8B model, beside 14 GB of bf16 projections). A
prefill of at least PREFILL_TOKENS tokens (backends/cuda/backend.py) quantises its activations
per token, in one Triton kernel that reads each bf16 row once and writes its FP8 values and its
scale (the SiLU kernel does the same for the down projection's input, so that its bf16 output is
never written), and multiplies with `torch._scaled_mm`'s row-wise scaling:
y = (q_x @ q_w.T) * s_x[M, 1] * s_w[1, N], accumulated in float32, written in bf16.

`_scaled_mm` wants its first operand row-major and its second column-major (q_w [N, K]
row-major, transposed: a view), K and N multiples of 16 (a projection that is not keeps bf16),
and an sm89+ GPU (Ada, Hopper); row-wise scales are float32, [M, 1] and [1, N], contiguous.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

# isort: off
from switchyard.engine.backends.cuda import triton_common  # noqa: F401  (sets TRITON_INTERPRET first)
import torch
import triton
import triton.language as tl
# isort: on

from switchyard.engine.backends.cuda import prefill_kernels as pk

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
MIN_AMAX = 1e-12  # a row of zeros gets a tiny scale (and FP8 zeros), never 0 / 0
# Prefills of at least this many tokens (the step's, padding included) run on the FP8 copies: the
# threshold at which the torch backend switches to compiled ops and cuDNN's attention (a long
# prompt's time is its GEMMs'). Below it bf16 stays, and with it the start-up check against the
# torch backend (an 8-token prefill, model/warmup.py). A module value: the benches move it.
PREFILL_TOKENS = 4096
# use_fast_accum: Hopper's FP8 MMA without cuBLAS's periodic float32 promotion, faster and less
# exact over a long K (14,336 for an 8B's down projection). Off until measured (bench/engine_cuda.py
# --ttft-fp8 times both).
FAST_ACCUM = False
_F8MAX = tl.constexpr(FP8_MAX)
_MIN_AMAX = tl.constexpr(MIN_AMAX)
# Triton's interpreter rounds float32 to float8 wrongly (124.2 -> 64.0, ties away from even), so
# interpreted kernels store the scaled float32 values and the host casts them (torch rounds to
# nearest even, as the GPU's cvt.rn.satfinite does); compiled kernels store FP8.
_CAST_ON_HOST = os.environ.get("TRITON_INTERPRET", "") == "1"


# -- activations: one kernel per quantisation --------------------------------------------------


@triton.jit
def _store_row(y, live, q_at, s_at):
    """Row y (float32, masked lanes 0) as FP8 values at q_at and its dequantising scale at s_at."""
    amax = tl.maximum(tl.max(tl.abs(y), axis=0), _MIN_AMAX)
    inv = tl.math.div_rn(_F8MAX, amax)  # correctly rounded, as torch divides: the same codes
    q = tl.clamp(y * inv, -_F8MAX, _F8MAX)
    tl.store(q_at, q.to(q_at.dtype.element_ty), mask=live)
    tl.store(s_at, tl.math.div_rn(amax, _F8MAX))


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    live = c < K
    x = tl.load(x_ptr + row * stride + c, mask=live, other=0.0).to(tl.float32)
    _store_row(x, live, q_ptr + row * K + c, s_ptr + row)


@triton.jit
def _silu_mul_quant_kernel(gu_ptr, q_ptr, s_ptr, INTER, BLOCK: tl.constexpr):
    # prefill_kernels._silu_mul_kernel's SiLU(gate) * up, quantised before it is ever stored
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    live = c < INTER
    g = tl.load(gu_ptr + row * 2 * INTER + c, mask=live, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * INTER + INTER + c, mask=live, other=0.0).to(tl.float32)
    _store_row(g / (1.0 + tl.exp(-g)) * u, live, q_ptr + row * INTER + c, s_ptr + row)


def _launch(kernel: Any, src: torch.Tensor, rows: int, width: int, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """One program a row, the whole row in one block (read once: 16K elements of an 8B's down
    projection are 32 registers a thread at 16 warps)."""
    q = torch.empty(rows, width, dtype=torch.float32 if _CAST_ON_HOST else FP8, device=src.device)
    s = torch.empty(rows, 1, dtype=torch.float32, device=src.device)
    block = triton.next_power_of_2(width)
    if rows:
        kernel[(rows,)](src, q, s, width, *args, BLOCK=block, num_warps=min(16, max(4, block // 1024)))
    return (q.to(FP8) if _CAST_ON_HOST else q), s


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (any float dtype) -> FP8 [M, K] and float32 scales [M, 1], per row: s = amax / 448,
    q = x * (448 / amax), so that x ~ q * s (quant_reference's values)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return _launch(_quant_rows_kernel, x, x.shape[0], x.shape[1], x.stride(0))


def silu_mul_quant(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """prefill_kernels.silu_mul of a fused [M, 2 I] gate_up output, quantised as quant_rows
    quantises, without the bf16 [M, I] in between."""
    gu = gu.contiguous()
    return _launch(_silu_mul_quant_kernel, gu, gu.shape[0], gu.shape[1] // 2)


def quant_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' scheme in torch's ops: the weights' quantisation at load, and the tests'
    reference. Row-wise: FP8 [M, K], float32 scales [M, 1]."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(MIN_AMAX)
    inv = torch.full_like(amax, FP8_MAX).div_(amax)  # true division (448 / t is a reciprocal times 448)
    return (xf * inv).clamp_(-FP8_MAX, FP8_MAX).to(FP8), amax / FP8_MAX


# -- weights and the matmul ----------------------------------------------------------------------


class Fp8Weight:
    """The FP8 copy of a dense projection y = x W^T + b: W [N, K] as FP8 with a float32 scale per
    output row, kept as _scaled_mm's column-major second operand takes it (W^T is a view)."""

    __slots__ = ("w", "scale", "b")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None) -> None:
        q, s = quant_reference(w)
        self.w = q  # [N, K] row-major
        self.scale = s.view(1, -1)  # [1, N], contiguous
        self.b = b

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> bf16 [M, N]: x quantised per row, then mm."""
        return self.mm(*quant_rows(x))

    def mm(self, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Already quantised rows (q FP8 [M, K], s float32 [M, 1]) -> bf16 [M, N]."""
        y = torch._scaled_mm(q, self.w.t(), scale_a=s, scale_b=self.scale, out_dtype=torch.bfloat16,
                             use_fast_accum=FAST_ACCUM)
        # The bias (Qwen2's QKV) added after: one extra pass over the output of one projection.
        return y if self.b is None else y + self.b


def eligible(w: torch.Tensor) -> bool:
    """Whether _scaled_mm takes this weight's shape (K and N multiples of 16)."""
    return w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0


PROJECTIONS = ("qkv", "o", "gate_up", "down")


def attach(layers: Sequence[Any]) -> None:
    """Give each layer's dense projections (model/linear.Dense) their FP8 copy, `.fp8` (None where
    the shape does not suit _scaled_mm: that projection stays bf16). On the weights' device; a
    transient float32 copy of one projection at a time."""
    for layer in layers:
        for name in PROJECTIONS:
            proj = getattr(layer, name)
            w = getattr(proj, "w", None)
            proj.fp8 = Fp8Weight(w, proj.b) if w is not None and eligible(w) else None


def carried(layers: Sequence[Any]) -> bool:
    """Whether the layers carry FP8 copies (--prefill-fp8)."""
    return bool(layers) and any(getattr(getattr(layers[0], n), "fp8", None) is not None for n in PROJECTIONS)


def unsupported(device: torch.device, dtype: torch.dtype) -> str:
    """Why FP8 prefill cannot run on this device and model dtype ("" when it can)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"FP8 matmuls need a CUDA GPU, not {device}"
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        return f"FP8 matmuls need an sm89+ GPU (Ada, Hopper or later); {torch.cuda.get_device_name(device)} is " \
               f"sm{cap[0]}{cap[1]}"
    if dtype != torch.bfloat16:
        return f"FP8 prefill copies bfloat16 projections; the model runs {str(dtype).removeprefix('torch.')}"
    return ""


# -- what the cuda backend calls ------------------------------------------------------------------


def project(proj: Any, x: torch.Tensor) -> torch.Tensor:
    """A projection of a long prefill: on its FP8 copy where it has one, else as it is."""
    w8 = getattr(proj, "fp8", None)
    return proj(x) if w8 is None else w8(x)


def mlp(gate_up: Any, down: Any, h: torch.Tensor) -> torch.Tensor:
    """down(SiLU(gate) * up) of the normed rows h, on the FP8 copies; the SiLU kernel quantises the
    down projection's input itself."""
    gu = project(gate_up, h)
    w8 = getattr(down, "fp8", None)
    return down(pk.silu_mul(gu)) if w8 is None else w8.mm(*silu_mul_quant(gu))


def check(layers: Sequence[Any], rows: int = 16, tol: float = 0.1) -> str:
    """The start-up check (model/warmup.py): layer 0's FP8 projections against its bf16 ones on
    `rows` random rows, the down projection through the SiLU kernel. "" when each output is within
    `tol` of bf16's (relative Frobenius norm), else why not. It catches a matmul that does not run
    here or computes something else (a wrong layout or scale: errors of order 1), not rounding (an
    FP8 product of random rows is ~4% off: 3.6-3.9% on SmolLM2's real layers, each factor within
    2^-4 relative). The prefill's logits against bf16's on real weights are the tests' business
    (tests/engine/test_cuda_fp8.py)."""
    from switchyard.engine.backends.torch_ops import silu_mul

    layer = layers[0]
    w0 = layer.qkv.w
    g = torch.Generator(device=w0.device).manual_seed(0)

    def rel(got: torch.Tensor, want: torch.Tensor) -> float:
        return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))

    name = "qkv"
    try:
        for name in PROJECTIONS:
            proj = getattr(layer, name)
            if getattr(proj, "fp8", None) is None:
                continue
            k = proj.w.shape[1] * (2 if name == "down" else 1)
            x = torch.randn(rows, k, generator=g, device=w0.device, dtype=torch.float32).to(w0.dtype)
            got, want = (proj.fp8.mm(*silu_mul_quant(x)), proj(silu_mul(x))) if name == "down" else (proj.fp8(x), proj(x))
            err = rel(got, want)
            if not err <= tol:  # NaN too
                return f"FP8 {name} projection {err:.3g} from bf16's (relative norm; a bound of {tol})"
    except Exception as e:  # _scaled_mm without kernels for this device or shape
        return f"FP8 {name} projection failed: {type(e).__name__}: {e}"[:300]
    return ""

