"""Compile every kernel variant ahead of time, so that no training or test run waits for it.

Triton: each variant (dtype, head dim, mask, deterministic or atomic, audit, GQA, exact) is
one compiled backward kernel plus its forward and pre/post kernels, a few seconds each;
tiny problems are run in parallel processes, and a later process with the same
``TRITON_CACHE_DIR`` loads them from disk. Lengths and head counts are not part of a
kernel's specialization, so a tiny problem compiles exactly the kernel a large one runs::

    python -m dash_cuda.warmup --processes 16 --dtypes bf16 fp16 --head-dims 64 128 --audit \\
        --exact

CuTe: CuTe DSL keeps compiled kernels in memory only, so ``--cute-aot DIR`` exports every
variant as an object file (``DIR/<variant>.o``; this needs no GPU) and a process with
``DASH_CUTE_AOT_DIR=DIR`` loads them in milliseconds::

    python -m dash_cuda.warmup --cute-aot /tmp/dash_cute_aot --processes 8
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import time

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def compile_variant(variant: tuple) -> tuple[tuple, float]:
    """Run one tiny forward + backward with the variant's flags; return the seconds it took."""
    import torch

    import dash_cuda

    dtype, head_dim, causal, deterministic, audit, group, exact = variant
    start = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = getattr(torch, DTYPES[dtype])
    heads = 2 * group
    q = torch.randn(1, 80, heads, head_dim, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(1, 96, heads // group, head_dim, device="cuda", dtype=dt, generator=gen)
    v = torch.randn_like(k)
    do = torch.randn_like(q)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend="triton")
    dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, schedule="naive",
                                 deterministic=deterministic, audit=audit, exact=exact,
                                 backend="triton")
    torch.cuda.synchronize()
    return variant, time.perf_counter() - start


def variants(dtypes, head_dims, audit: bool, exact: bool = False, groups=(1, 2)
             ) -> list[tuple]:
    """Every Triton combination to compile; audit and exact variants only where they run."""
    out = []
    for dtype, d, causal, det, group in itertools.product(dtypes, head_dims, (False, True),
                                                          (True, False), groups):
        modes = (False, True) if exact and det else (False,)
        for ex in modes:
            out.append((dtype, d, causal, det, False, group, ex))
            if audit and det and group == 1:
                out.append((dtype, d, causal, det, True, group, ex))
    return out


def cute_variants(dtypes, head_dims) -> list:
    """Every shipped CuTe kernel variant of these dtypes and head dims
    (:func:`dash_cuda.backends.cute.variants.shipped_variants`)."""
    import torch

    from dash_cuda.backends.cute.variants import shipped_variants

    return shipped_variants(tuple(getattr(torch, DTYPES[d]) for d in dtypes), tuple(head_dims))


def export_cute(args: tuple) -> tuple[str, float]:
    variant, folder = args
    from dash_cuda.backends.cute.launch import export_kernels

    start = time.perf_counter()
    export_kernels([variant], folder)
    return variant.name, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=None,
                        help="default: every head dim the backend runs")
    parser.add_argument("--audit", action="store_true", help="also the audit variants")
    parser.add_argument("--exact", action="store_true", help="also the exact=True variants")
    parser.add_argument("--cute-aot", metavar="DIR", default=None,
                        help="export the CuTe kernels to DIR instead of warming Triton's")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.cute_aot:
        from dash_cuda.backends.cute.config import HEAD_DIMS

        todo = [(v, args.cute_aot) for v in
                cute_variants(args.dtypes, [d for d in args.head_dims or HEAD_DIMS
                                            if d in HEAD_DIMS])]
        job, context = export_cute, multiprocessing.get_context("spawn")
    else:
        from dash_cuda.backends.triton.config import HEAD_DIMS

        head_dims = [d for d in args.head_dims or (64, 128) if d in HEAD_DIMS]
        todo = variants(args.dtypes, head_dims, args.audit, args.exact)
        job = compile_variant
        context = multiprocessing.get_context("spawn")  # each process its own CUDA context
    with context.Pool(args.processes) as pool:
        for variant, seconds in pool.imap_unordered(job, todo):
            print(f"compiled {variant} in {seconds:.1f} s", flush=True)
    print(f"{len(todo)} variants in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
