"""Experiment: launch orders that keep few heads in flight (L2), on packed batches and bands.

``lpt`` and ``banded`` launch chain ``j`` of every head before chain ``j + 1`` of any, so
every head of the batch is in flight at once; ``lpt_fX`` / ``banded_fX`` launch the heads in
groups (heads by work, descending; a group closes once its chains reach ``X * W``), the
same orders inside a head (the same bits: placement only). Backward only, eager, interleaved
rounds, against FlashAttention-4 with and without ``deterministic=True``::

    python benchmarks/exp_head_groups.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import grad_row, interleaved_rounds
from model_varlen import lengths

from dash_ref.schedules import schedule as S

FILLS = (2, 3, 4, 6, 8)


def head_groups(p, num_workers: int, fill: float) -> dict:
    heads = list(S._heads(p))
    work = {bh: sum(len(r) for r in p.chain_rows_of(bh[0])) for bh in heads}
    group, count, out = 0, 0, {}
    for bh in sorted(heads, key=lambda bh: (-work[bh], bh)):
        out[bh] = group
        count += len(p.chain_rows_of(bh[0]))
        if count >= fill * num_workers:
            group, count = group + 1, 0
    return out


def grouped(base: str, fill: float):
    def build(p, num_workers):
        groups = head_groups(p, num_workers, fill)
        chains = [S.Chain(b, h, j, rows[::-1]) for b, h in S._heads(p)
                  for j, rows in enumerate(p.chain_rows_of(b))]
        if base == "lpt":
            chains.sort(key=lambda c: (groups[(c.b, c.h)], -len(c.visits), c.j, c.b, c.h))
        else:
            chains.sort(key=lambda c: (groups[(c.b, c.h)], c.j, c.b, c.h))
        ref = S.BUILDERS[base](p, num_workers)
        return S._assemble(p, f"{base}_f{fill}", num_workers,
                           S._place_greedy([(c,) for c in chains], num_workers),
                           dict(ref.dq_orders))
    return build


def register() -> None:
    import dash_cuda.checks as checks

    names = []
    for base in ("lpt", "banded"):
        for fill in FILLS:
            S.BUILDERS[f"{base}_f{fill}"] = grouped(base, fill)
            names.append(f"{base}_f{fill}")
    checks.RAGGED = (*checks.RAGGED, *[n for n in names if n.startswith("lpt")])
    checks.BANDED = (*checks.BANDED, *[n for n in names if n.startswith("banded")])


CELLS = ([("varlen", t, m) for t, m in ((16384, "heavy"), (16384, "equal"), (16384, "uniform"),
                                       (65536, "heavy"))]
         + [("window", s, w) for s, w in ((8192, 1024), (8192, 4096), (16384, 1024),
                                          (16384, 4096))])


def rows_of(cell, gen) -> dict:
    import torch
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    import dash_cuda

    kind, a, b = cell
    bf16 = torch.bfloat16

    def leaves(*xs):
        return tuple(x.detach().requires_grad_() for x in xs)

    rows = {}
    if kind == "varlen":
        seqlens = lengths(b, a)
        cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
        longest = max(seqlens)
        q, k, v, do = (torch.randn(a, 16, 128, generator=gen, device="cuda", dtype=bf16)
                       for _ in range(4))
        for s in ("auto", "lpt", *(f"lpt_f{f}" for f in FILLS)):
            x = leaves(q, k, v)
            rows[s] = grad_row(lambda s=s, x=x: dash_cuda.attention_varlen(
                *x, cu, cu, longest, longest, causal=True, schedule=s, backend="cute"), x, do)
        for det in (True, False):
            x = leaves(q, k, v)
            rows["fa4-det" if det else "fa4"] = grad_row(
                lambda det=det, x=x: flash_attn_varlen_func(
                    *x, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                    max_seqlen_k=longest, causal=True, deterministic=det)[0], x, do)
        return rows
    batch = 16384 // a
    q, k, v, do = (torch.randn(batch, a, 16, 128, generator=gen, device="cuda", dtype=bf16)
                   for _ in range(4))
    for s in ("banded", *(f"banded_f{f}" for f in FILLS)):
        x = leaves(q, k, v)
        rows[s] = grad_row(lambda s=s, x=x: dash_cuda.attention(
            *x, causal=True, window_size=(b, 0), schedule=s, backend="cute"), x, do)
    for det in (True, False):
        x = leaves(q, k, v)
        rows["fa4-det" if det else "fa4"] = grad_row(
            lambda det=det, x=x: flash_attn_func(*x, causal=True, window_size=(b, None),
                                                 deterministic=det)[0], x, do)
    return rows


def main() -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--time-budget", type=float, default=300)
    args = ap.parse_args()
    register()
    gen = torch.Generator(device="cuda").manual_seed(0)
    report, start = [], time.monotonic()
    for cell in CELLS:
        if time.monotonic() - start > args.time_budget:
            print("time budget spent at", cell)
            break
        t0 = time.monotonic()
        rows = rows_of(cell, gen)
        for _, bwd in rows.values():
            bwd()
        torch.cuda.synchronize()
        ms = interleaved_rounds({r: f[1] for r, f in rows.items()}, args.rounds, args.reps)
        med = {r: round(statistics.median(t), 4) for r, t in ms.items()}
        print(cell, med, f"({time.monotonic() - t0:.0f} s)", flush=True)
        report.append({"cell": cell, "ms": ms, "median_ms": med})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exp_head_groups.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
