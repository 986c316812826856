"""A/B of CuTe backward kernels in one process: TFLOP/s side by side and equal bits.

A base is a set of exported kernel objects of another revision (the GPU machine has no git
history): export them on any machine from that revision's package, no GPU needed, then time
them on the GPU against the working tree's kernels (``DASH_CUTE_AOT_DIR``)::

    git archive REV dash_cuda dash_ref | tar x -C /tmp/base
    PYTHONPATH=/tmp/base python benchmarks/ab_backward.py --export ab/base   # CPU
    python benchmarks/ab_backward.py --base base=ab/base --out OUT            # GPU

The revision must call its kernels through the TVM-FFI entry (``launch.COMPILE_OPTIONS``)
and list its variants in ``dash_cuda.backends.cute.variants`` (whose names carry the
configuration), as this one does (``e37b0be`` on): its objects are loaded by name and called
as this revision's, and a base folder that lacks a kernel the cells time is refused.
``--windows W ...`` adds causal windows ``(W, 0)`` (the window kernel, ``banded``) to the
cells. Each cell times every kernel twice in turn (the best of two medians each, so a drift of the
clock hits all) on the best deterministic schedule of the mask (``shift`` full, ``symmetric_
shift`` causal) and on the atomic peer, and checks dQ, dK and dV of each deterministic base
against the candidate with ``torch.equal``: a change that moves no add must keep the bits.
Writes ``ab_backward.json`` and ``ab_backward.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import (
    HIDDEN,
    TOKENS,
    cute_backward_variant,
    flops_backward,
    grid_inputs,
    group_error,
    no_cuda,
    save_report,
    timed,
)


def variants(head_dims, per_head: bool = False, windows: bool = False):
    """The kernels the grid runs: bf16, both masks (and, ``windows``, the window kernel),
    deterministic and atomic (``per_head``: the grouped-query ones, which keep dK and dV per
    query head)."""
    import torch

    masks = ("full", "causal", "window") if windows else ("full", "causal")
    return [cute_backward_variant(torch.bfloat16, d, mask, det, per_head=per_head)
            for d in head_dims for mask in masks for det in (True, False)]


def load_base(folder: Path, head_dims, per_head: bool = False, windows: bool = False) -> dict:
    """``{variant: kernel}`` of the objects exported into ``folder``."""
    from dash_cuda.backends.cute import launch

    return {v: launch.load_exported(str(folder), v.name)
            for v in variants(head_dims, per_head, windows)
            if (folder / f"{v.name}.o").is_file()}


def run(args) -> dict:
    import torch

    import dash_cuda
    from dash_cuda import plans
    from dash_cuda.backends.cute import launch
    from dash_ref import Problem

    per_head = args.group > 1
    windows = bool(args.windows)
    bases = {name: load_base(Path(folder), args.head_dims, per_head, windows)
             for name, folder in args.base}
    wanted = {v.name for v in variants(args.head_dims, per_head, windows)}
    for name, folder in args.base:
        missing = sorted(wanted - {v.name for v in bases[name]})
        if missing:
            raise SystemExit(f"ab_backward: {folder} has no {', '.join(missing)} "
                             f"(base {name!r}: export it from a revision that names its "
                             "variants as this one does)")
    if "candidate" in bases:
        raise SystemExit("ab_backward: 'candidate' names the working tree; rename that base")
    candidate = {v: launch.get_kernel(v) for v in variants(args.head_dims, per_head, windows)}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    # (causal, window) of the cells: both masks, then each causal window (w, 0)
    masks = [(False, None), (True, None), *((True, (w, 0)) for w in args.windows)]
    for d in args.head_dims:
        for causal, window in masks:
            for s in args.seqlens:
                h, b = HIDDEN // d, TOKENS // s
                q, k, v, do = grid_inputs(d, s, gen, args.group)
                extra = {} if window is None else {"window_size": window}
                o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute",
                                                     **extra)
                flops = (flops_backward(b, h, s, d, causal) if window is None else Problem(
                    b, h, h, s, s, d, "causal", window_size=window).flops_backward())
                best = "banded" if window else "symmetric_shift" if causal else "shift"
                for schedule in (best, "atomic"):
                    det = schedule != "atomic"

                    def backward(schedule=schedule, det=det, causal=causal, q=q, k=k, v=v,
                                 o=o, lse=lse, do=do, extra=extra):
                        return dash_cuda.attention_backward(
                            q, k, v, o, lse, do, causal=causal, schedule=schedule,
                            deterministic=det, backend="cute", **extra)

                    kernels = {**bases, "candidate": candidate}
                    tflops: dict[str, float] = {}
                    outs = {}
                    for _ in range(2):
                        for name, ks in kernels.items():
                            launch._cache.update(ks)
                            plans.clear()  # a plan keeps the kernel it was bound to
                            ms, _ = timed(backward, args.warmup, args.reps)
                            tflops[name] = max(tflops.get(name, 0.0), flops / ms / 1e9)
                            outs[name] = backward()
                    launch._cache.update(candidate)
                    plans.clear()
                    same = {n: all(torch.equal(x, y) for x, y in zip(outs[n], outs["candidate"]))
                            for n in bases} if det else {}
                    mask = f"window {window[0]}" if window else "causal" if causal else "full"
                    row = {"d": d, "mask": mask, "S": s,
                           "schedule": schedule,
                           "tflops": {n: round(t, 1) for n, t in tflops.items()},
                           "bits_equal": same}
                    rows.append(row)
                    print(f"d={d} {row['mask']:<6} S={s:<5} {schedule:<15} " + "  ".join(
                        f"{n} {t:6.1f}" for n, t in tflops.items())
                        + "  bits equal: " + " ".join(f"{n}={e}" for n, e in same.items()),
                        flush=True)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "bases": [name for name, _ in args.base], "rows": rows}


def markdown(report: dict) -> str:
    names = report["bases"]
    head = ["d", "mask", "S", "schedule", *names, "candidate",
            *[f"candidate / {n}" for n in names], *[f"bits equal {n}" for n in names]]
    lines = ["# CuTe backward A/B: candidate against bases, one process", "",
             f"`{report['command']}`", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in report["rows"]:
        t = r["tflops"]
        cells = [str(r["d"]), r["mask"], str(r["S"]), r["schedule"],
                 *[f"{t[n]:.1f}" for n in names], f"{t['candidate']:.1f}",
                 *[f"{t['candidate'] / t[n]:.3f}" for n in names],
                 *[("yes" if r["bits_equal"][n] else "NO") if r["bits_equal"] else "-"
                   for n in names]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_base(text: str) -> tuple[str, str]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, default=None,
                    help="export the kernels of the dash_cuda on sys.path here and stop")
    ap.add_argument("--base", type=parse_base, action="append", default=[],
                    help="NAME=DIR of exported kernels (repeat for several bases)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--windows", type=int, nargs="*", default=[],
                    help="also causal windows (W, 0) of these widths (the window kernel)")
    ap.add_argument("--group", type=int, default=1,
                    help="query heads per KV head: > 1 times the grouped-query kernels")
    args = ap.parse_args(argv)
    error = group_error(args.group, args.head_dims)
    if error:
        print(f"ab_backward: --group: {error}", file=sys.stderr)
        return 2
    if args.export is not None:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        from dash_cuda.backends.cute import launch

        plain = variants(args.head_dims, args.group > 1, bool(args.windows))
        for v in plain:
            launch.export_kernel(launch.compile_kernel(v), str(args.export), v.name)
        print(f"exported {len(plain)} kernels to {args.export}")
        return 0
    if not args.base:
        print("ab_backward: give at least one --base NAME=DIR", file=sys.stderr)
        return 2
    missing = [folder for _, folder in args.base if not Path(folder).is_dir()]
    if missing:
        print(f"ab_backward: no folder {', '.join(missing)}", file=sys.stderr)
        return 2
    if no_cuda("ab_backward"):
        return 2
    report = run(args)
    save_report(args.out, "ab_backward", report, markdown(report))  # prints the table
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
