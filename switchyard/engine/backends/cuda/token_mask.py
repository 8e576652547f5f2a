"""A step's grammar masks applied to GPU logits in one Triton kernel.

The torch path (backends/cpu/token_mask.apply_token_bitmask_torch) takes four or five launches
(the bits ANDed with the powers of two, compared with zero, the masked fill, the padding past the
mask, and for some rows an index_select and index_copy); at SmolLM2's 0.65 ms step the host's
launches are the step's pace, so one kernel reads each masked row's bitmask words and writes -inf
where a token's bit is clear, in place, into the masked rows only.

The host's cost of that launch is on the step's path at batch 1 (an H100's host: 49-52 us a step
served, bench/host_launch_costs.py), so two things are cut from it:
- the bitmask is read where llguidance wrote it: pinned host memory is mapped into the GPU's
  address space (UVA), so the kernel reads each masked row's words over the bus, and no copy (an
  allocation, a queued transfer: ~11-15 us) goes before it. The masker's two buffers, used in
  turn, keep a step's bits in place until its kernel has run (its caller's promise, as for the
  copy it replaces). A CPU tensor that is not pinned still goes up first.
- after the first launch of a specialization, the compiled kernel is launched through its
  handle, without triton's argument binding and cache lookup (~16-20 us to ~10-12).

With `wait=(flag, ticket)` the masking may be queued before its bits exist (the masks filled
ahead, chat/grammar.GrammarMasker): a one-program kernel before it spins until the pinned word
flag[0] reaches `ticket`, which the masker's thread writes once the step's bits are all written,
so the host launches the masking, the sampling and the next step without waiting for
llguidance. The poll is a system-scope acquire load (volatile loads kept seeing a stale flag for
milliseconds). A wait that outlasts SPINS reads (a fill thread that died) gives up, writes the
ticket into flag[1], which the masker turns into an error on the host, and lets the masking run
on whatever bits are there.
"""

from __future__ import annotations

import torch

# triton_common sets TRITON_INTERPRET before triton loads (no GPU: the kernel is interpreted).
from switchyard.engine.backends.cuda.triton_common import INTERPRETED, HandleLaunch, tl, triton
from switchyard.engine.backends.transfer import upload

BLOCK = 2048  # tokens a program: 49k-128k vocabularies give 24-63 programs a row
IN_PLACE = True  # pinned bitmasks read where they are (False: copied to the device first)
COMPILED = True  # launches after the first through the compiled kernel's handle (False: triton's JIT entry)
SPINS = 1 << 21  # flag reads before a waiting kernel gives up: each a trip over the bus, ~1 us, so seconds


@triton.jit
def _acquire_sys(ptr, SYS: tl.constexpr):
    """flag[0], as the host last wrote it: a system-scope acquire load (ld.acquire.sys). A
    volatile load is not enough: the GPU kept serving a stale copy of the host's word for
    milliseconds, and ld.cv for good (bench/results/gpu_grammar_ahead). Interpreted: a plain load
    of host memory."""
    one = ptr + tl.zeros([1], tl.int32)
    if SYS:
        v = tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [one], dtype=tl.int64,
                                      is_pure=False, pack=1)
    else:
        v = tl.load(one, volatile=True)
    return tl.max(v, axis=0)


@triton.jit(do_not_specialize=["ticket"])
def _wait_kernel(flag_ptr, ticket, spins, SYS: tl.constexpr):
    """One program: until flag[0] >= ticket, or `spins` reads (then flag[1] = ticket). One poller
    and not every masking program: with each of the mask's programs polling at system scope, a
    step grew with their number, ~5 us a program (0.6 ms at the 8B's 63 a row, 4.5-4.9 ms at 16
    rows: bench/results/gpu_grammar_ahead, call 4)."""
    seen = _acquire_sys(flag_ptr, SYS)
    n = 0
    while (seen < ticket) & (n < spins):
        seen = _acquire_sys(flag_ptr, SYS)
        n += 1
    if seen < ticket:
        tl.store(flag_ptr + 1, ticket.to(tl.int64))


@triton.jit
def _bitmask_kernel(logits_ptr, stride_l, bm_ptr, words, rows_ptr, V, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + r).to(tl.int64) if ROWS else r.to(tl.int64)
    # Each of the block's words read once (over the bus when pinned: a load a token cost 32 times
    # the transfers), then spread to its 32 tokens. Words past the mask (a vocabulary padded past
    # the grammar's tokenizer) read as 0: never allowed.
    wi = tl.program_id(1) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    w = tl.load(bm_ptr + row * words + wi, mask=wi < words, other=0)
    bit = (w[:, None] >> tl.arange(0, 32)[None, :]) & 1
    blocked = tl.reshape(bit, (BLOCK,)) == 0
    neg = tl.full((BLOCK,), float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_l + cols, neg, mask=(cols < V) & blocked)


_launch = HandleLaunch(_bitmask_kernel, exact=2)  # BLOCK, ROWS: constexprs
_launch_wait = HandleLaunch(_wait_kernel, exact=1, num_warps=1)  # SYS: a constexpr


def apply_token_bitmask_cuda(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int],
                             wait: tuple[torch.Tensor, int] | None = None) -> None:
    """logits [B, V] in place (rows contiguous: a row's tokens side by side); bitmask int32
    [>= B, W] on the host, row i masking logits row i, pinned (read in place); rows: the masked
    rows. The same -inf's as apply_token_bitmask_torch (tests/engine/test_cuda_kernels.py).
    wait: (flag, ticket), flag a pinned int64 [2]: the bits are read once flag[0] >= ticket."""
    if not rows:
        return
    if logits.stride(1) != 1:
        assert wait is None, "a waiting mask needs rows with contiguous tokens"
        from switchyard.engine.backends.cpu.token_mask import apply_token_bitmask_torch
        apply_token_bitmask_torch(logits, bitmask, rows)
        return
    dev = logits.device
    B, V = logits.shape
    every = len(rows) == B and rows == list(range(B))
    bm = bitmask[:B]
    if wait is not None:
        assert dev.type == "cpu" or bm.is_pinned(), "a waiting mask reads its bits where they are written"
    elif dev.type != "cpu" and not (IN_PLACE and bm.is_pinned()):
        bm = upload(bm, torch.int32, dev)
    idx = bm if every else upload(rows, torch.int64, dev)  # not read when every row is masked
    W = bm.shape[1]
    if wait is not None:  # the bits come later: the mask's stream waits for their ticket first
        _launch_wait((1,), (wait[0], wait[1], SPINS, not INTERPRETED), compiled=COMPILED)
    _launch((len(rows), triton.cdiv(V, BLOCK)), (logits, logits.stride(0), bm, W, idx, V, BLOCK, not every),
            compiled=COMPILED)

