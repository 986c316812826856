"""The CuTe forward's launch options side by side: grid size, tile hand-out, causal order.

One kernel, six launches of it per cell, through ``launch.run_forward(..., num_ctas=...,
sections=..., dynamic=...)``: persistent (one CTA per SM, each taking every 132nd tile, or
"dynamic": the next tile from a global counter) or one CTA per tile, with the causal tiles
longest first over all heads ("interleaved") or within sections of heads whose K and V fit
in L2 (``launch.l2_heads``). Neither changes the bits (checked with ``torch.equal``), so
``launch.forward_grid`` may pick by speed alone; the ``rule`` column is what it picks::

    python benchmarks/forward_grid.py --out OUT          # GPU, about a minute

Writes ``forward_grid.json`` and ``forward_grid.md`` (bf16, 16384 tokens, hidden 2048).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import (
    HIDDEN,
    TOKENS,
    cute_forward_block_m,
    cute_forward_block_ms,
    no_cuda,
    provenance,
    save_report,
    timed,
)

OPTIONS = ("persistent interleaved", "persistent sections", "dynamic interleaved",
           "dynamic sections", "per-tile interleaved", "per-tile sections")


def launches(tiles: int, sms: int, heads: int, section: int
             ) -> dict[str, tuple[int, int, bool]]:
    """``(CTAs, heads per section, dynamic)`` of each option: persistent CTAs take every
    CTAs-th tile (static) or the next one from a counter (dynamic)."""
    persistent = min(tiles, sms)
    return dict(zip(OPTIONS, [(persistent, heads, False), (persistent, section, False),
                              (persistent, heads, True), (persistent, section, True),
                              (tiles, heads, False), (tiles, section, False)]))


def run(cells: list[tuple[int, bool, int]], warmup: int, reps: int,
        block_ms: list[int] | None = None) -> list[dict]:
    """Every launch option of each cell; with ``block_ms``, of each of those tile heights
    the head dim has (options then named ``m<rows> <option>``)."""
    import torch

    from dash_cuda.backends.cute.launch import forward_grid, l2_heads, run_forward

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d, causal, s in cells:
        heads, batch = HIDDEN // d, max(1, TOKENS // s)
        q, k, v = (torch.randn(batch, s, heads, d, device="cuda", generator=gen).bfloat16()
                   for _ in range(3))
        flops = 4 * batch * heads * s * s * d / (2 if causal else 1)
        chosen = cute_forward_block_m(d, causal, s)
        options, rule = {}, None  # name -> (block_m, CTAs, heads per section, dynamic)
        for bm in [m for m in (block_ms or [chosen]) if m in cute_forward_block_ms(d)]:
            tiles = batch * heads * -(-s // bm)
            for name, launch in launches(tiles, sms, batch * heads,
                                         l2_heads(k, batch * heads)).items():
                options[f"m{bm} {name}" if block_ms else name] = (bm, *launch)
            if bm == chosen:
                rule = (bm, *forward_grid(d, causal, s, tiles, sms, k, batch * heads))
        tflops: dict[str, float] = {}
        outs = {}
        for _ in range(2):  # in turn, twice: a clock drift hits every option
            for name, (bm, ctas, section, dynamic) in options.items():
                def forward(q=q, k=k, v=v, causal=causal, scale=d ** -0.5, bm=bm, ctas=ctas,
                            section=section, dynamic=dynamic):
                    return run_forward(q, k, v, causal, scale, block_m=bm, num_ctas=ctas,
                                       sections=section, dynamic=dynamic)
                ms, _ = timed(forward, warmup, reps)
                tflops[name] = max(tflops.get(name, 0.0), flops / ms / 1e9)
                outs[name] = forward()
        first = next(iter(outs.values()))
        row = {"d": d, "mask": "causal" if causal else "full", "S": s,
               "tflops": {n: round(t, 1) for n, t in tflops.items()},
               "rule": next((n for n, o in options.items() if o == rule), None),
               "bits_equal": all(torch.equal(a, b) for o in outs.values()
                                 for a, b in zip(o, first))}
        rows.append(row)
        print(f"d={d} {row['mask']:<6} S={s:<5} " + "  ".join(
            f"{n} {t:6.1f}" for n, t in tflops.items()) + f"  rule: {row['rule']}"
            f"  bits equal: {row['bits_equal']}", flush=True)
    return rows


def markdown(report: dict) -> str:
    if any(set(r["tflops"]) != set(OPTIONS) for r in report["rows"]):
        return long_markdown(report)
    lines = ["# CuTe forward: launch options, one kernel (TFLOP/s)", "",
             f"`{report['command']}`; git {report['git_revision']}", "",
             "| d | mask | S | " + " | ".join(OPTIONS) + " | rule | rule / best | bits equal |",
             "|" + "---|" * (len(OPTIONS) + 6)]
    for r in report["rows"]:
        t = r["tflops"]
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | "
                     + " | ".join(f"{t[n]:.1f}" for n in OPTIONS)
                     + f" | {r['rule']} | {t[r['rule']] / max(t.values()):.3f} | "
                     + ("yes" if r["bits_equal"] else "NO") + " |")
    return "\n".join(lines) + "\n"


def long_markdown(report: dict) -> str:
    """One line per (cell, option): for runs over several tile heights."""
    lines = ["# CuTe forward: tile heights and launch options, one process (TFLOP/s)", "",
             f"`{report['command']}`; git {report['git_revision']}", "",
             "| d | mask | S | option | TFLOP/s | / best | rule | bits equal |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        t = r["tflops"]
        for name, value in sorted(t.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {name} | {value:.1f} | "
                         f"{value / max(t.values()):.3f} | {'yes' if name == r['rule'] else ''}"
                         f" | {'yes' if r['bits_equal'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 16384])
    ap.add_argument("--masks", nargs="+", default=["causal"], choices=["full", "causal"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--block-ms", type=int, nargs="+", default=None,
                    help="time these tile heights too (those the head dim has)")
    ap.add_argument("--tag", default="forward_grid")
    args = ap.parse_args(argv)
    if no_cuda("forward_grid"):
        return 2
    cells = [(d, m == "causal", s) for d in args.head_dims for m in args.masks
             for s in args.seqlens]
    report = {**provenance("forward_grid.py", argv),
              "rows": run(cells, args.warmup, args.reps, args.block_ms)}
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
