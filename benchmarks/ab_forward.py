"""A/B of two CuTe forward kernels in one process: TFLOP/s side by side and equal bits.

The base is a saved copy of ``dash_cuda/backends/cute/fwd_kernel.py`` (the GPU machine has no
git history, so save it first and carry it), the candidate the working tree's::

    git show REV:dash_cuda/backends/cute/fwd_kernel.py > /tmp/base_fwd.py
    python benchmarks/ab_forward.py --base-file /tmp/base_fwd.py --out benchmarks/results

Each cell times base, candidate, base, candidate (the best of two medians each, so a drift
of the clock hits both), FlashAttention-4's forward when importable, and checks O and LSE2
of the two with ``torch.equal``: a change that only reorders independent work must keep the
bits. Both run through ``dash_cuda.attention_forward``'s launch, whose grid follows the
candidate's tile height (a persistent base kernel walks its own tiles whatever the grid).
Writes ``ab_forward.json`` and ``ab_forward.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
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


def run(args) -> dict:
    import torch
    from bench_backward import timed

    import dash_cuda
    from dash_cuda.backends.cute import launch
    from dash_cuda.backends.cute.fwd_kernel import forward_block_m
    from verify.impls import load_fa4

    base = load_base(args.base_file)
    fa = load_fa4()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for d in args.head_dims:
        for causal in (False, True):
            for s in args.seqlens:
                h, b = 2048 // d, 16384 // s
                q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16()
                           for _ in range(3))
                block_m = forward_block_m(d, causal, s)
                variant = launch.ForwardVariant(torch.bfloat16, d, causal, block_m)
                obj, base_m = base_kernel(base, variant, s)
                kernels = {"base": launch.cute.compile(obj, *variant.placeholder_args(),
                                                       options="--gpu-arch=sm_90a"),
                           "candidate": launch.get_kernel(variant)}
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
                same = all(torch.equal(a, c) for a, c in zip(outs["base"], outs["candidate"]))
                row = {"d": d, "mask": "causal" if causal else "full", "S": s,
                       "block_m": {"base": base_m, "candidate": block_m},
                       "tflops": {k_: round(v_, 1) for k_, v_ in tflops.items()},
                       "bits_equal": same}
                rows.append(row)
                print(f"d={d} {row['mask']:<6} S={s:<5} " + "  ".join(
                    f"{k_} {v_:6.1f}" for k_, v_ in tflops.items())
                    + f"  candidate/base {tflops['candidate'] / tflops['base']:.3f}"
                    + f"  bits equal: {same}", flush=True)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]),
            "base_file": str(args.base_file), "rows": rows}


def markdown(report: dict) -> str:
    lines = ["# CuTe forward A/B: candidate against base, one process", "",
             f"`{report['command']}`", "",
             "| d | mask | S | base | candidate | candidate / base | FA4 | candidate / FA4 | "
             "bits equal |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        t = r["tflops"]
        fa4 = t.get("fa4")
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {t['base']:.1f} | "
                     f"{t['candidate']:.1f} | {t['candidate'] / t['base']:.3f} | "
                     f"{fa4 if fa4 else '-'} | "
                     f"{t['candidate'] / fa4 if fa4 else float('nan'):.3f} | "
                     f"{'yes' if r['bits_equal'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-file", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 4096, 16384])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("ab_forward: no CUDA device", file=sys.stderr)
        return 2
    if not args.base_file.is_file():
        print(f"ab_forward: no base file {args.base_file}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).parent))
    from report import save_report

    report = run(args)
    save_report(args.out, "ab_forward", report, markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
