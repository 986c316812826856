"""A/B of CuTe backward configurations in one process: TFLOP/s side by side, equal bits.

A configuration's stages and in-tile choices move no add (``block_m`` and ``block_n`` are
the problem's and stay): each alternative (``--change NAME=FIELD=VALUE[,FIELD=VALUE]``, the
fields of :class:`dash_cuda.backends.cute.config.BackwardConfig`) is exported on the CPU
from the working tree, then runs on the GPU in place of the shipped variant's kernel, and
its dQ, dK and dV are checked against the shipped kernel's with ``torch.equal``. Every
kernel is timed in interleaved rounds (CUDA graph replays, median of ``--reps``) on the
grid's cells (``--cells D:MASK:S``), the best deterministic schedule and the atomic peer::

    python benchmarks/ab_backward_config.py --change q3=q_stages=3 --export ab/alt   # CPU
    python benchmarks/ab_backward_config.py --change q3=q_stages=3 --alt ab/alt     # GPU

(the same ``--cells`` and ``--change`` both times; a folder that lacks an alternative is
refused). Writes ``ab_backward_config.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from harness import (
    HIDDEN,
    TOKENS,
    cute_backward_variant,
    flops_backward,
    grid_inputs,
    no_cuda,
    parse_cell,
    provenance,
    rotating_rounds,
    save_report,
    timed,
)

#: the default cells: the grid's at d = 96 (whose 64 x 128 tiles leave shared memory for a
#: third Q stage or staged partial: ``experiments/backward_d96_stages.md``)
CELLS = ["96:causal:1024", "96:causal:4096", "96:causal:16384", "96:full:4096"]


def parse_change(text: str) -> tuple[str, dict[str, int | bool]]:
    """``NAME=FIELD=VALUE[,FIELD=VALUE]`` as ``(name, {field: value})`` (an ``argparse``
    type; values are ints, or ``true`` / ``false``)."""
    name, sep, rest = text.partition("=")
    change = {}
    for item in rest.split(","):
        field, eq, value = item.partition("=")
        if not eq or not field:
            break
        change[field] = (value == "true") if value in ("true", "false") else int(value)
    else:
        if name and sep and name != "shipped":
            return name, change
    raise argparse.ArgumentTypeError(f"expected NAME=FIELD=VALUE[,FIELD=VALUE], got {text!r}")


def shipped_variant(d: int, mask: str, det: bool, softcap: float = 0.0):
    """The kernel the backend ships for a cell's call (bf16; ``softcap`` > 0: the softcap
    kernel)."""
    import torch

    return cute_backward_variant(torch.bfloat16, d, mask, det, softcap=softcap > 0)


def variants(cells, changes, softcap: float = 0.0) -> dict[object, dict[str, object]]:
    """``{shipped variant: {name: alternative variant}}`` of every kernel the cells time
    (deterministic and atomic)."""
    out = {}
    for d, mask in dict.fromkeys((d, mask) for d, mask, _ in cells):
        for det in (True, False):
            shipped = shipped_variant(d, mask, det, softcap)
            out[shipped] = {name: replace(shipped, config=replace(shipped.config, **c))
                            for name, c in changes}
    return out


def run(args) -> dict:
    import torch

    import dash_cuda
    from dash_cuda import plans
    from dash_cuda.backends.cute import launch

    alternatives = variants(args.cells, args.change, args.softcap)
    cap = args.softcap
    kernels_of = {shipped: {"shipped": launch.get_kernel(shipped),
                            **{n: launch.load_exported(str(args.alt), v.name)
                               for n, v in alts.items()}}
                  for shipped, alts in alternatives.items()}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d, mask, s in args.cells:
        causal = mask == "causal"
        h, b = HIDDEN // d, TOKENS // s
        q, k, v, do = grid_inputs(d, s, gen)
        o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute",
                                             softcap=cap)
        flops = flops_backward(b, h, s, d, causal)
        for schedule in ("symmetric_shift" if causal else "shift", "atomic"):
            det = schedule != "atomic"
            shipped = shipped_variant(d, mask, det, cap)
            kernels = kernels_of[shipped]

            def backward(schedule=schedule, det=det, causal=causal, q=q, k=k, v=v, o=o,
                         lse=lse, do=do):
                return dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                                    schedule=schedule, deterministic=det,
                                                    backend="cute", softcap=cap)

            def use(name, shipped=shipped, kernels=kernels):
                launch._cache[shipped] = kernels[name]
                plans.clear()  # a plan keeps the kernel it was bound to

            outs = {}
            for name in kernels:
                use(name)
                outs[name] = [x.clone() for x in backward()]

            def measure(name, flops=flops, backward=backward, use=use):
                use(name)
                return flops / timed(backward, args.warmup, args.reps)[0] / 1e9

            rounds = rotating_rounds({n: (lambda n=n: measure(n)) for n in kernels},
                                     args.rounds)
            use("shipped")
            same = {n: all(torch.equal(x, y) for x, y in zip(outs[n], outs["shipped"]))
                    for n in kernels if n != "shipped"} if det else {}
            tf = {n: round(statistics.median(t), 1) for n, t in rounds.items()}
            rows.append({"d": d, "mask": mask, "S": s, "softcap": cap, "schedule": schedule,
                         "configs": {"shipped": shipped.config.name,
                                     **{n: v.config.name
                                        for n, v in alternatives[shipped].items()}},
                         "tflops": tf, "rounds": {n: [round(x, 1) for x in t]
                                                  for n, t in rounds.items()},
                         "bits_equal": same})
            print(f"d={d} {mask:<6} S={s:<5} {schedule:<15} "
                  + "  ".join(f"{n} {t:6.1f}" for n, t in tf.items())
                  + f"  bits equal {same}", flush=True)
    props = torch.cuda.get_device_properties(0)
    return {**provenance("ab_backward_config.py", sys.argv[1:]), "device": props.name,
            "rounds": args.rounds, "reps": args.reps, "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# CuTe backward configurations against the shipped one, one process", "",
             f"`{report['command']}` at `{report['git_revision']}`, {report['device']}, bf16, "
             f"the grid's cells (16384 tokens, hidden 2048); CUDA graph replays, "
             f"{report['rounds']} interleaved rounds of {report['reps']} (TFLOP/s, median of "
             "the rounds); bits: dQ, dK, dV `torch.equal` to the shipped kernel's.", "",
             "| cell | schedule | configuration | TFLOP/s | this / shipped | bits equal |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        t = r["tflops"]
        for name, cname in r["configs"].items():
            bits = ("yes" if r["bits_equal"][name] else "NO") if r["bits_equal"] and \
                name != "shipped" else "-"
            cap = f" softcap {r['softcap']:g}" if r.get("softcap") else ""
            lines.append(f"| d {r['d']} {r['mask']}{cap} S={r['S']} | {r['schedule']} | {name} "
                         f"`{cname}` | {t[name]:.1f} | {t[name] / t['shipped']:.3f} | {bits} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=None,
                    help="export the alternatives' kernels here (no GPU needed) and stop")
    ap.add_argument("--alt", type=Path, default=None,
                    help="folder of the alternatives' exported kernels")
    ap.add_argument("--cells", type=parse_cell, nargs="+", default=[parse_cell(c) for c in CELLS])
    ap.add_argument("--change", type=parse_change, action="append", required=True,
                    help="NAME=FIELD=VALUE[,FIELD=VALUE]: an alternative (repeat for more)")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="every cell with this softcap (its kernels)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/experiments"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    if args.export is not None:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        from dash_cuda.backends.cute import launch

        alts = [v for a in variants(args.cells, args.change, args.softcap).values()
                for v in a.values()]
        names = launch.export_kernels(alts, str(args.export))
        print(f"exported {len(names)} kernels to {args.export}")
        return 0
    if args.alt is None or not args.alt.is_dir():
        print("ab_backward_config: give --alt DIR, a folder --export wrote", file=sys.stderr)
        return 2
    missing = sorted(v.name for a in variants(args.cells, args.change, args.softcap).values()
                     for v in a.values() if not (args.alt / f"{v.name}.o").is_file())
    if missing:
        print(f"ab_backward_config: {args.alt} lacks {len(missing)} alternatives "
              f"({missing[0]}, ...): export them with the same --cells and --change",
              file=sys.stderr)
        return 2
    if no_cuda("ab_backward_config"):
        return 2
    report = run(args)
    save_report(args.out, "ab_backward_config", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
