"""How kernel outputs are judged against the fp32 reference: the tolerances of
`attnbench.kernels.bench.reference.TOLERANCES` on every written row, with a message that points
at the worst element (see test_tolerance_catches_* for proof that they can fail)."""

from __future__ import annotations

import os
import random
from typing import Callable

import torch

from attnbench.kernels import PagedBatch
from attnbench.kernels.bench.reference import TOLERANCES, within_tolerance

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def fresh_seed() -> int:
    """A new seed per check (fresh random inputs), reported on failure."""
    return random.SystemRandom().randrange(2**31)


def mismatch(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, rows: int | None = None) -> str | None:
    """None if ``out`` matches ``ref`` within tolerance, else a description of the worst miss."""
    rows = ref.shape[0] if rows is None else rows
    out, ref = out[:rows].float().cpu(), ref[:rows].float().cpu()
    if within_tolerance(out, ref, dtype)[1]:
        return None
    if not torch.isfinite(out).all():
        bad = (~torch.isfinite(out)).nonzero()[0].tolist()
        return f"non-finite output at [token, head, dim] = {bad} (unwritten or NaN)"
    atol, rtol = TOLERANCES[dtype]
    excess = (out - ref).abs() - (atol + rtol * ref.abs())  # where it fails worst
    idx = tuple(int(i) for i in (excess == excess.max()).nonzero()[0])
    return (f"max excess {excess.max().item():.3e} at [token, head, dim] = {list(idx)}: "
            f"out {out[idx].item():.5f} vs ref {ref[idx].item():.5f} (atol {atol}, rtol {rtol:.1e})")


def poisoned_like(q: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so any row a kernel forgets to write fails."""
    return torch.full_like(q, float("nan"))


def poison_past_sequences(batch: PagedBatch) -> None:
    """NaN in every cache slot of a sequence's last page past its length (and in the spare
    pages): a kernel that lets them into ``P V`` writes NaN."""
    used = torch.zeros(batch.k_cache.shape[:2], dtype=torch.bool)
    table = batch.block_table.cpu()  # one copy, not a device read per page
    for s, spec in enumerate(batch.seqs):
        for pos in range(0, spec.seq_len, batch.block_size):
            page = int(table[s, pos // batch.block_size])
            used[page, : min(batch.block_size, spec.seq_len - pos)] = True
    used = used.to(batch.k_cache.device)
    batch.k_cache[~used] = float("nan")
    batch.v_cache[~used] = float("nan")


def build_head_case(heads: tuple, compose: Callable[[random.Random], list[tuple[int, int]]], seed: int,
                    window_range: tuple[int, int]) -> PagedBatch:
    """A batch of ``compose(rng)`` sequences with the heads of a test's head case ``(q heads,
    kv heads, head size, page size, dtype, extras)``: ``extras`` may ask for a softcap, a
    sliding window (``"random"``: drawn from ``window_range``) and queries scaled by
    ``q_scale`` (sharper softmax rows). Every cache slot past a sequence holds NaN
    (`poison_past_sequences`)."""
    hq, hkv, head, bs, dtype, extras = heads
    rng = random.Random(seed)
    window = extras.get("sliding_window")
    if window == "random":
        window = rng.randint(*window_range)
    batch = PagedBatch.build(compose(rng), num_q_heads=hq, num_kv_heads=hkv, head_size=head, block_size=bs,
                             dtype=dtype, device=DEVICE, sliding_window=window,
                             softcap=extras.get("softcap", 0.0), seed=seed)
    if "q_scale" in extras:
        batch.q.mul_(extras["q_scale"])
    poison_past_sequences(batch)
    return batch
