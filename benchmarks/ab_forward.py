"""A/B of CuTe forward kernels in one process: TFLOP/s side by side and equal bits.

Each base is a saved copy of ``dash_cuda/backends/cute/fwd_kernel.py`` (the GPU machine has
no git history, so save it first and carry it), named by its file's stem; the candidate is
the working tree's. Compile the bases on any machine first (``--export``, no GPU), so that
the GPU only times::

    git show REV:dash_cuda/backends/cute/fwd_kernel.py > ab/base.py
    python benchmarks/ab_forward.py --base-file ab/base.py --export ab/aot     # CPU
    python benchmarks/ab_forward.py --base-file ab/base.py --aot ab/aot --out OUT  # GPU

Each cell times every kernel twice in turn (the best of two medians each, so a drift of the
clock hits all), FlashAttention-4's forward when importable, and checks O and LSE2 of each
base against the candidate with ``torch.equal``: a change that only reorders independent
work must keep the bits. All run through ``dash_cuda.attention_forward``'s launch, whose grid
follows the candidate's tile height (a persistent base kernel walks its own tiles whatever
the grid); a base from before the tile counter (``17957ae``) gets the launch's arguments
less the counter and hands its tiles out statically. Writes ``ab_forward.json`` and
``ab_forward.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


def load_base(path: Path):
    """The base file as a module, its relative imports made absolute."""
    source = path.read_text().replace("from .", "from dash_cuda.backends.cute.")
    spec = importlib.util.spec_from_loader("dash_ab_base_fwd", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = str(path)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - our own file
    return module


# Positions, in the launch arguments of ``launch.ForwardVariant.placeholder_args`` and
# ``launch.run_forward``, of the tile counter's pointer and the ``dynamic`` flag, which
# kernels from before ``17957ae`` do not take.
COUNTER_ARGS = (5, 13)


def takes_counter(module) -> bool:
    """Whether a base kernel takes the tile counter (it hands out tiles dynamically)."""
    return "counter_ptr" in Path(module.__file__).read_text()


def without_counter(args):
    """A launch's arguments as a kernel from before the tile counter takes them."""
    return [a for n, a in enumerate(args) if n not in COUNTER_ARGS]


def callable_as_candidate(module, kernel):
    """The base kernel, called with the candidate's launch arguments (an older base runs
    its static tile hand-out whatever the launch asks for)."""
    if takes_counter(module):
        return kernel
    return lambda *args: kernel(*without_counter(args))


def base_kernel(module, variant, seqlen_q: int):
    """The base's kernel object for ``variant`` and its tile height, whichever constructor
    the base has (before and after tile heights became per call)."""
    import inspect

    from dash_cuda.backends.cute import launch

    dtype = launch._DTYPES[variant.dtype]
    params = inspect.signature(module.DashForwardSm90).parameters
    if "block_m" in params:
        block_m = module.forward_block_m(variant.head_dim, variant.causal, seqlen_q)
        return module.DashForwardSm90(dtype, variant.head_dim, causal=variant.causal,
                                      block_m=block_m), block_m
    return module.DashForwardSm90(dtype, variant.head_dim, causal=variant.causal), \
        module.FORWARD_TILES[variant.head_dim].block_m


def grid_variants(args):
    """``(d, causal, S, variant)`` of every cell, the candidate's tile height."""
    import torch

    from dash_cuda.backends.cute import launch
    from dash_cuda.backends.cute.fwd_kernel import forward_block_m

    for d in args.head_dims:
        for causal in (False, True):
            for s in args.seqlens:
                yield d, causal, s, launch.ForwardVariant(
                    torch.bfloat16, d, causal, forward_block_m(d, causal, s))


def compile_base(module, variant, seqlen_q: int):
    """The base's compiled kernel for ``variant``'s cell and its tile height."""
    obj, block_m = base_kernel(module, variant, seqlen_q)
    return compile_object(obj, variant, module), block_m


def compile_object(obj, variant, module):
    from dash_cuda.backends.cute import launch

    args = variant.placeholder_args()
    return launch.compile_object(obj, args if takes_counter(module) else without_counter(args))


def aot_name(variant, block_m: int) -> str:
    return f"{variant.name}_base{block_m}"


def export(args) -> None:
    """Compile every base for every cell (no GPU needed) into ``--export/<stem>/``."""
    from dash_cuda.backends.cute import launch

    for path in args.base_file:
        module = load_base(path)
        folder = args.export / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        done = set()
        for _, _, s, variant in grid_variants(args):
            kernel, block_m = compile_base(module, variant, s)
            name = aot_name(variant, block_m)
            if name not in done:
                launch.export_kernel(kernel, str(folder), name)
                done.add(name)
                print(f"{path.stem}: {name}", flush=True)


def load_or_compile(path: Path, module, variant, seqlen_q: int, aot: Path | None):
    """The base kernel from ``--aot`` when exported there, else compiled here."""
    from dash_cuda.backends.cute import launch

    obj, block_m = base_kernel(module, variant, seqlen_q)
    name = aot_name(variant, block_m)
    if aot is not None and (aot / path.stem / (name + ".o")).is_file():
        kernel = launch.load_exported(str(aot / path.stem), name)
    else:
        kernel = compile_object(obj, variant, module)
    return callable_as_candidate(module, kernel), block_m


def run(args) -> dict:
    import torch
    from bench_backward import timed

    import dash_cuda
    from dash_cuda.backends.cute import launch
    from verify.impls import load_fa4

    bases = {path.stem: (path, load_base(path)) for path in args.base_file}
    if "candidate" in bases:
        raise SystemExit("ab_forward: 'candidate' names the working tree; rename that base")
    fa = load_fa4()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d, causal, s, variant in grid_variants(args):
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16()
                   for _ in range(3))
        kernels, heights = {}, {}
        for name, (path, module) in bases.items():
            kernels[name], heights[name] = load_or_compile(path, module, variant, s, args.aot)
        kernels["candidate"], heights["candidate"] = launch.get_kernel(variant), variant.block_m
        flops = 4 * b * h * s * s * d / (2 if causal else 1)

        def forward(q=q, k=k, v=v, causal=causal):
            return dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute")

        tflops: dict[str, float] = {}
        outs = {}
        for _ in range(2):
            for name, kernel in kernels.items():
                launch._cache[variant] = kernel
                ms, _ = timed(forward, args.warmup, args.reps)
                tflops[name] = max(tflops.get(name, 0.0), flops / ms / 1e9)
                outs[name] = forward()
        launch._cache[variant] = kernels["candidate"]
        if fa is not None:
            ms, _ = timed(lambda q=q, k=k, v=v, c=causal: fa(q, k, v, causal=c),
                          args.warmup, args.reps)
            tflops["fa4"] = flops / ms / 1e9
        same = {name: all(torch.equal(a, c) for a, c in zip(outs[name], outs["candidate"]))
                for name in bases}
        row = {"d": d, "mask": "causal" if causal else "full", "S": s, "block_m": heights,
               "tflops": {k_: round(v_, 1) for k_, v_ in tflops.items()},
               "bits_equal": same}
        rows.append(row)
        print(f"d={d} {row['mask']:<6} S={s:<5} " + "  ".join(
            f"{k_} {v_:6.1f}" for k_, v_ in tflops.items())
            + "  bits equal: " + " ".join(f"{n}={e}" for n, e in same.items()), flush=True)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "bases": [str(p) for p in args.base_file], "rows": rows}


def markdown(report: dict) -> str:
    names = [Path(p).stem for p in report["bases"]]
    head = ["d", "mask", "S", *names, "candidate", *[f"candidate / {n}" for n in names],
            "FA4", "candidate / FA4", *[f"bits equal {n}" for n in names]]
    lines = ["# CuTe forward A/B: candidate against bases, one process", "",
             f"`{report['command']}`", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in report["rows"]:
        t = r["tflops"]
        fa4 = t.get("fa4")
        cells = [str(r["d"]), r["mask"], str(r["S"]), *[f"{t[n]:.1f}" for n in names],
                 f"{t['candidate']:.1f}", *[f"{t['candidate'] / t[n]:.3f}" for n in names],
                 f"{fa4:.1f}" if fa4 else "-",
                 f"{t['candidate'] / fa4:.3f}" if fa4 else "-",
                 *["yes" if r["bits_equal"][n] else "NO" for n in names]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-file", type=Path, action="append", required=True,
                    help="a saved fwd_kernel.py (repeat for several bases)")
    ap.add_argument("--export", type=Path, default=None,
                    help="compile the bases into this folder and stop (no GPU needed)")
    ap.add_argument("--aot", type=Path, default=None, help="bases exported by --export")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 4096, 16384])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.base_file if not p.is_file()]
    if missing:
        print(f"ab_forward: no base file {', '.join(missing)}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    if args.export is not None:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
        export(args)
        return 0
    from report import no_cuda, save_report

    if no_cuda("ab_forward"):
        return 2
    report = run(args)
    save_report(args.out, "ab_forward", report, markdown(report))  # prints the table
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
