"""The pass that sums dK and dV over the query heads of a KV head, alone, per launch config.

``prepost.dash_gqa_kernel`` reads the fp32 per-query-head accumulators of grouped-query
attention (and of audit runs) and writes the rounded dK and dV. It moves bytes only, so its
launch config decides its time; every config gives the same bits (checked here against the
first). 16384 tokens, hidden 2048 (``d = 64, H = 32`` and ``d = 128, H = 16``), ``S_k =
1024``::

    python benchmarks/bench_gqa_pass.py --out benchmarks/results

Writes ``<tag>.json`` and ``<tag>.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_attention import HIDDEN, TOKENS, group_error
from report import no_cuda, provenance, save_report

SEQLEN = 1024
HEAD_DIMS = (64, 128)
CONFIGS = [(64, 8), (64, 4), (128, 8), (128, 4), (32, 4), (256, 8)]  # (rows, warps)


def launcher(dk_heads, dv_heads, heads_kv: int, group: int, block_n: int, warps: int):
    """The rounded ``(dK, dV)`` outputs and a no-argument launch of the pass into them."""
    import torch
    import triton

    from dash_cuda.prepost import dash_gqa_kernel

    batch, seqlen, _, d = dk_heads.shape
    dk = torch.empty(batch, seqlen, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    dv = torch.empty_like(dk)

    def launch():
        dash_gqa_kernel[(triton.cdiv(seqlen, block_n), batch * heads_kv)](
            dk_heads, dv_heads, dk, dv, dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2), heads_kv, seqlen, 0.125,
            GROUP=group, BN=block_n, HEAD_DIM=d, num_warps=warps)

    return (dk, dv), launch


def run(groups: list[int]) -> list[dict]:
    import torch
    import triton

    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d in HEAD_DIMS:
        heads, batch = HIDDEN // d, TOKENS // SEQLEN
        for group in groups:
            dk_heads, dv_heads = (torch.randn(batch, SEQLEN, heads, d, device="cuda",
                                              generator=gen) for _ in range(2))
            first = None
            for block_n, warps in CONFIGS:
                outs, launch = launcher(dk_heads, dv_heads, heads // group, group, block_n,
                                        warps)
                launch()
                torch.cuda.synchronize()
                if first is None:
                    first = tuple(t.clone() for t in outs)
                same = all(torch.equal(a, b) for a, b in zip(first, outs))
                us = 1000 * triton.testing.do_bench(launch, warmup=20, rep=200)
                rows.append({"d": d, "group": group, "block_n": block_n, "num_warps": warps,
                             "us": round(us, 1), "same_bits_as_first": same})
                print(f"d={d} group={group} rows={block_n:3d} warps={warps}: {us:7.1f} us  "
                      f"same bits {same}", flush=True)
    return rows


def markdown(report: dict) -> str:
    lines = ["# The GQA head-sum pass alone, per launch config", "",
             f"`{report['command']}`, git `{report['git_revision']}`", "",
             "| d | query heads per KV head | rows | warps | us | bits as the first config |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['d']} | {r['group']} | {r['block_n']} | {r['num_warps']} | "
                     f"{r['us']:.1f} | {'yes' if r['same_bits_as_first'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--tag", default="gqa_pass_configs")
    ap.add_argument("--groups", type=int, nargs="+", default=[4, 1])
    args = ap.parse_args(argv)
    errors = [group_error(g, HEAD_DIMS) for g in args.groups]
    if any(errors):
        print(f"bench_gqa_pass: --groups: {next(e for e in errors if e)}", file=sys.stderr)
        return 2
    if no_cuda("bench_gqa_pass"):
        return 2
    report = {**provenance("bench_gqa_pass.py", argv), "rows": run(args.groups)}
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
