"""Compile every kernel variant ahead of time, in parallel processes, into Triton's disk cache.

Each variant (dtype, head dim, mask, deterministic or atomic, audit, GQA, exact) is one compiled
backward kernel plus its forward and pre/post kernels, a few seconds of compiler time
each. A later process with the same ``TRITON_CACHE_DIR`` loads them from disk instead of
compiling. Lengths and head counts are not part of a kernel's specialization, so a tiny
problem compiles exactly the kernel a large one runs::

    python -m dash_cuda.warmup --processes 16 --dtypes bf16 fp16 --head-dims 64 128 --audit \
        --exact
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
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
    dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, schedule="naive",
                                 deterministic=deterministic, audit=audit, exact=exact)
    torch.cuda.synchronize()
    return variant, time.perf_counter() - start


def variants(dtypes, head_dims, audit: bool, exact: bool = False, groups=(1, 2)
             ) -> list[tuple]:
    """Every combination to compile; audit and exact variants only where they run."""
    out = []
    for dtype, d, causal, det, group in itertools.product(dtypes, head_dims, (False, True),
                                                          (True, False), groups):
        modes = (False, True) if exact and det else (False,)
        for ex in modes:
            out.append((dtype, d, causal, det, False, group, ex))
            if audit and det and group == 1:
                out.append((dtype, d, causal, det, True, group, ex))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--audit", action="store_true", help="also the audit variants")
    parser.add_argument("--exact", action="store_true", help="also the exact=True variants")
    args = parser.parse_args(argv)
    todo = variants(args.dtypes, args.head_dims, args.audit, args.exact)
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # each process makes its own CUDA context
    with context.Pool(args.processes) as pool:
        for variant, seconds in pool.imap_unordered(compile_variant, todo):
            print(f"compiled {variant} in {seconds:.1f} s", flush=True)
    print(f"{len(todo)} variants in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
