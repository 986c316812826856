"""A/B of CuTe forward configurations in one process: eager ms side by side, equal bits.

A forward's configuration (:class:`dash_cuda.backends.cute.config.ForwardConfig`) moves no
add, except ``block_n``: every configuration timed here keeps the head dim's ``block_n``,
and the O and LSE2 of each are checked against the shipped one's with ``torch.equal``.
Each cell times the shipped configuration, each alternative and FlashAttention-4's forward
(where installed) in interleaved rounds of eager calls (CUDA events, median of ``--reps``),
the alternatives by replacing the head dim's entry of the forward's table for the run::

    python benchmarks/ab_forward_config.py --out OUT

Writes ``ab_forward_config.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

from harness import load_fa4, median_ms, no_cuda, provenance, rotating_rounds, save_report

#: (d, d_v, causal, S, B, H) of the cells: the anchors' head-dim shapes and S = 16k
CELLS = [(256, 256, True, 4096, 2, 8), (256, 256, False, 2048, 4, 8),
         (256, 256, True, 16384, 1, 8), (192, 128, True, 4096, 4, 16),
         (192, 192, True, 4096, 4, 16)]


def alternatives():
    """``{head dim: {name: ForwardConfig}}`` tried beside the shipped configuration."""
    from dash_cuda.backends.cute.config import ForwardConfig

    return {256: {"kv1": ForwardConfig(128, 64, 1), "kv2o128": ForwardConfig(128, 64, 2, 128)},
            192: {"kv3o64": ForwardConfig(128, 64, 3, 64), "kv3": ForwardConfig(128, 64, 3)}}


def cell_row(args, fa, gen, d: int, dv: int, causal: bool, s: int, b: int, h: int) -> dict:
    """One cell: every configuration of the head dim and FlashAttention-4, in rounds."""
    import torch

    import dash_cuda
    from dash_cuda import plans
    from dash_cuda.backends.cute import config, launch

    shipped = config._FORWARD[d][128]
    configs = {"shipped": shipped}
    for name, c in alternatives()[d].items():
        if c != shipped and dv % (c.o_cols or dv) == 0 and c.shared_bytes(d, dv) <= 227 * 1024:
            configs[name] = c
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, s, h, dv, device="cuda", dtype=torch.bfloat16, generator=gen)

    def use(c):
        config._FORWARD[d][128] = c
        launch._forward_plan.cache_clear()
        plans.clear()

    def call():
        return dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute")

    def measure(c):  # sets the configuration outside the timed calls
        use(c)
        return median_ms(call, args.reps)

    outs = {}
    for name, c in configs.items():
        use(c)
        outs[name] = call()
    same = {name: all(torch.equal(x, y) for x, y in zip(outs[name], outs["shipped"]))
            for name in configs if name != "shipped"}
    measures = {name: partial(measure, c) for name, c in configs.items()}
    if fa is not None:
        measures["fa4"] = partial(median_ms, lambda: fa(q, k, v, causal=causal), args.reps)
    rounds = rotating_rounds(measures, args.rounds)
    use(shipped)
    ms = {name: statistics.median(t) for name, t in rounds.items()}
    row = {"d": d, "d_v": dv, "mask": "causal" if causal else "full", "S": s, "B": b, "H": h,
           "configs": {n: c.name for n, c in configs.items()},
           "ms": {n: round(t, 4) for n, t in ms.items()},
           "rounds": {n: [round(x, 4) for x in t] for n, t in rounds.items()},
           "bits_equal": same}
    print(f"d={d}/{dv} {row['mask']} S={s} B={b} H={h}: " + "  ".join(
        f"{n} {t:.3f}" for n, t in ms.items()) + f"  bits equal {same}", flush=True)
    return row


def run(args) -> dict:
    import torch

    fa = load_fa4()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = [cell_row(args, fa, gen, *cell) for cell in CELLS]
    props = torch.cuda.get_device_properties(0)
    return {**provenance("ab_forward_config.py", sys.argv[1:]),
            "device": props.name, "rounds": args.rounds, "reps": args.reps, "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# CuTe forward configurations against the shipped one, one process", "",
             f"`{report['command']}` at `{report['git_revision']}`, {report['device']}, bf16; "
             f"eager calls, {report['rounds']} interleaved rounds of {report['reps']} "
             "(median of the rounds' medians, ms); bits: O and LSE2 `torch.equal` to the "
             "shipped configuration's.", "",
             "| cell | configuration | ms | shipped / this | fa4 / this | bits equal |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        cell = f"d {r['d']}/{r['d_v']} {r['mask']} S={r['S']} B={r['B']} H={r['H']}"
        ms = r["ms"]
        for name, cname in r["configs"].items():
            fa4 = f"{ms['fa4'] / ms[name]:.3f}" if "fa4" in ms else "-"
            bits = "-" if name == "shipped" else ("yes" if r["bits_equal"][name] else "NO")
            lines.append(f"| {cell} | {name} `{cname}` | {ms[name]:.3f} | "
                         f"{ms['shipped'] / ms[name]:.3f} | {fa4} | {bits} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/experiments"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    if no_cuda("ab_forward_config"):
        return 2
    report = run(args)
    save_report(args.out, "ab_forward_config", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
