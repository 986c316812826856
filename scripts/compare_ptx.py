#!/usr/bin/env python3
"""Compile every shipped kernel variant in two source trees for sm_90 and compare the PTX.

For a change that must not change the kernels (a refactor, a rename), the PTX of the tree
before and the tree after must be the same text. Runs on any machine with Triton (no GPU:
the target is given, not queried)::

    python scripts/compare_ptx.py --backend triton|cute BASE_TREE NEW_TREE [--jobs N] [--keep DIR]

``--backend cute`` compiles every shipped CuTe DSL variant of each tree for sm_90a (the
tree's own list: ``variants.shipped_variants``, or in older trees the union of warm-up's and
``inspect_ptx``'s lists), keyed by what the variant is (kind, dtype, head dim, mask, flags;
the forward's tile height) rather than by its name, which may carry more in one tree, and
compares the PTX byte for byte (CuTe DSL writes no line information). Variants only the new
tree ships (a new mask kind) are listed, not compared; one the new tree lacks is an error.

Each tree is imported in its own processes (``BASE_TREE`` first on ``sys.path``, a fresh
``TRITON_CACHE_DIR``), which compile every variant and write its PTX; this process then
compares them. Variants: the forward and the persistent backward (bf16/fp16, every head dim
of ``config.HEAD_DIMS``, full/causal; the backward deterministic and atomic, default and
``exact``, audit, per-head fp32 dK/dV or rounded; a sliding window, ``MASK="window"`` with
its runtime extents, in the forward and the backward's deterministic and atomic, default and
``exact`` kernels), and the kernels around the backward
(``D`` with and without its pairwise tree at the query tiles of both backends, the dQ
epilogues, the GQA sum). Each is compiled in two specializations:

- ``launch``: what a launch on contiguous ``(B, S, H, d)`` tensors binds (Triton's own
  binder on the arguments: 16-byte aligned pointers, strides multiples of 16, the row
  statistics' unit stride a constant 1);
- ``plain``: nothing assumed about the arguments, as ``inspect_asm`` compiles them;

and each with Triton's line information (as shipped) and without it
(``TRITON_DISABLE_LINE_INFO=1``). With line information the PTX names the source files
(``.file``, the tree's own path) and lines (``.loc``, and the DWARF ``.section .debug_*``
blocks, which also name the inlined functions, whose ranges ``$L__tmp`` labels in the code
mark), so those lines are left out before comparing; without it the whole text is compared
byte for byte.

A variant the base tree has no kernel for (a window in a tree from before windows) is
compiled in the new tree only, to show it compiles, and listed; it is not compared.

The trees may name a switch differently; :func:`constants` maps the spellings in use
(the mask: ``CAUSAL`` bool or ``MASK`` kind; the ``D`` kernel's tree: ``EXACT`` or
``PAIRWISE``), and :data:`KERNELS` the modules a kernel has lived in. Exit status 0 when
every variant's PTX is the same in both trees, 1 otherwise (the first differing lines of
each are printed).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: kernel -> the (module, name) places it has lived in, newest first
KERNELS = {
    "fwd": [("dash_cuda.backends.triton.fwd_kernel", "dash_fwd_kernel")],
    "bwd": [("dash_cuda.backends.triton.bwd_kernel", "dash_bwd_kernel")],
    "delta": [("dash_cuda.prepost", "dash_delta_kernel")],
    "dq": [("dash_cuda.prepost", "dash_dq_kernel")],
    "gqa": [("dash_cuda.prepost", "dash_gqa_kernel")],
    "dq_tiles": [("dash_cuda.backends.cute.finish_dq", "dash_dq_tiles_kernel"),
                 ("dash_cuda.prepost", "dash_dq_tiles_kernel")],
}
#: the CuTe backward's query tile per head dim: the ``BM`` of the shared ``D`` kernel in a
#: CuTe run, and the staged dQ tiles' shape (``finish_dq_tiles`` accepts these two)
CUTE_BLOCK_M = {64: 128, 128: 64}
DTYPES = ("bf16", "fp16")
SPECS = ("launch", "plain")
#: the window the window variants launch with (its extents are runtime: any would do)
WINDOW = (256, 0)


class NoSuchKernel(Exception):
    """The tree has no kernel for this variant (a feature newer than the tree)."""


# -- the variants (tree-independent descriptions) ------------------------------------------
def variants(head_dims: tuple[int, ...]) -> list[dict]:
    """Every variant, as ``dict(kernel=..., name=..., **settings)``; tiles come from the tree."""
    out = []
    for dtype in DTYPES:
        for d in head_dims:
            for mask in ("full", "causal"):
                out.append(dict(kernel="fwd", dtype=dtype, head_dim=d, mask=mask))
                for det in (True, False):
                    for exact in ((False, True) if det else (False,)):  # exact: fixed orders
                        for audit, per_head in ((False, False), (False, True), (True, True)):
                            out.append(dict(kernel="bwd", dtype=dtype, head_dim=d, mask=mask,
                                            deterministic=det, exact=exact, audit=audit,
                                            per_head=per_head))
            out.append(dict(kernel="fwd", dtype=dtype, head_dim=d, mask="window"))
            for det, exact in ((True, False), (True, True), (False, False)):
                out.append(dict(kernel="bwd", dtype=dtype, head_dim=d, mask="window",
                                deterministic=det, exact=exact, audit=False, per_head=False))
            for block_m in sorted({64, CUTE_BLOCK_M.get(d, 64)}):
                for pairwise in (False, True):
                    out.append(dict(kernel="delta", dtype=dtype, head_dim=d, block_m=block_m,
                                    pairwise=pairwise))
            out.append(dict(kernel="dq", dtype=dtype, head_dim=d))
            for group in (1, 2, 4, 8):
                out.append(dict(kernel="gqa", dtype=dtype, head_dim=d, group=group))
            if d in CUTE_BLOCK_M:
                out.append(dict(kernel="dq_tiles", dtype=dtype, head_dim=d,
                                block_m=CUTE_BLOCK_M[d]))
    for v in out:
        v["name"] = "-".join([v["kernel"], *(f"{k}={x}" for k, x in v.items() if k != "kernel")])
    return out


# -- in a tree's own process ----------------------------------------------------------------
def constants(fn, settings: dict) -> dict:
    """The kernel's compile-time arguments, spelled as this tree's kernel spells them."""
    names = fn.arg_names
    out = {}
    for key, value in settings.items():
        if key == "MASK" and "MASK" not in names:
            out["CAUSAL"] = value == "causal"  # before the mask was a kind
        elif key == "PAIRWISE" and "PAIRWISE" not in names:
            out["EXACT"] = value  # before the D kernel's switch was renamed
        else:
            out[key] = value
    unknown = set(out) - set(names)
    if unknown:
        raise KeyError(f"{fn.__name__} has no arguments {sorted(unknown)}")
    return out


def launch_arguments(v: dict) -> tuple[object, dict, dict]:
    """The kernel, every argument by name as a contiguous launch passes it, and options."""
    import importlib

    import torch
    from triton.runtime.jit import MockTensor

    from dash_cuda.backends.triton.config import backward_config, forward_config

    for module, name in KERNELS[v["kernel"]]:
        try:
            fn = getattr(importlib.import_module(module), name)
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError(f"no kernel {v['kernel']!r} in {KERNELS[v['kernel']]}")

    window = {}
    if v.get("mask") == "window":
        if "WINDOW_LEFT" not in fn.arg_names:
            raise NoSuchKernel(v["name"])
        window = dict(WINDOW_LEFT=WINDOW[0], WINDOW_RIGHT=WINDOW[1])
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[v["dtype"]]
    f32, i32 = torch.float32, torch.int32
    d = v["head_dim"]
    seqlen, heads = 300, 8  # B = 2 (no argument depends on it but the batch strides)
    group = v.get("group", 2 if v.get("per_head") and not v.get("audit") else 1)
    heads_kv = heads // group

    def strides(prefix, h):  # a contiguous (B, S, h, d) tensor
        return {f"stride_{prefix}b": seqlen * h * d, f"stride_{prefix}s": h * d,
                f"stride_{prefix}h": d}

    # LSE2 and D: (B, S, H) views of (B, H, S) buffers
    row_stats = {"stride_lb": heads * seqlen, "stride_ls": 1, "stride_lh": seqlen}
    kind = v["kernel"]
    if kind == "fwd":
        cfg = forward_config(d)
        args = dict(Q=MockTensor(dt), K=MockTensor(dt), V=MockTensor(dt), O=MockTensor(dt),
                    LSE2=MockTensor(f32), **strides("q", heads), **strides("k", heads_kv),
                    **strides("v", heads_kv), **strides("o", heads), **row_stats,
                    H=heads, GROUP=group, S_Q=seqlen, S_K=seqlen, CAUSAL_OFFSET=0,
                    scale_log2=0.18033688, **window)
        const = dict(BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=d, HEAD_DIM_V=d, MASK=v["mask"])
        options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    elif kind == "bwd":
        cfg = backward_config(d)
        out = f32 if v["per_head"] else dt
        args = dict(Q=MockTensor(dt), K=MockTensor(dt), V=MockTensor(dt), DO=MockTensor(dt),
                    LSE2=MockTensor(f32), DELTA=MockTensor(f32), DQ_ACC=MockTensor(f32),
                    DK=MockTensor(out), DV=MockTensor(out), SEM=MockTensor(i32),
                    PARTIALS=MockTensor(f32),
                    **{t: MockTensor(i32) for t in ("WORKER_OFFSETS", "CHAIN_BHJ",
                                                    "CHAIN_OFFSETS", "VISIT_Q", "VISIT_RANK")},
                    **strides("q", heads), **strides("k", heads_kv), **strides("v", heads_kv),
                    **strides("do", heads), **row_stats,
                    **strides("dk", heads if v["per_head"] else heads_kv),
                    **strides("dv", heads if v["per_head"] else heads_kv),
                    H=heads, GROUP=group, S_Q=seqlen, S_K=seqlen,
                    N_Q=-(-seqlen // cfg.block_m), CAUSAL_OFFSET=0,
                    scale_log2=0.18033688, softmax_scale=0.125, **window)
        const = dict(BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=d, HEAD_DIM_V=d, MASK=v["mask"],
                     DETERMINISTIC=v["deterministic"], AUDIT=v["audit"],
                     PER_HEAD=v["per_head"], PREFETCH=cfg.prefetch, EXACT=v["exact"],
                     OPAQUE=True)
        options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                       enable_fp_fusion=not v["exact"])
    elif kind == "delta":
        args = dict(O=MockTensor(dt), DO=MockTensor(dt), DELTA=MockTensor(f32),
                    **strides("o", heads), **strides("do", heads), **row_stats,
                    H=heads, S_Q=seqlen)
        const = dict(BM=v["block_m"], HEAD_DIM=d, PAIRWISE=v["pairwise"])
        options = dict(enable_fp_fusion=not v["pairwise"])
    elif kind == "dq":
        args = dict(DQ_ACC=MockTensor(f32), DQ=MockTensor(dt), **strides("dq", heads),
                    H=heads, S_Q=seqlen, softmax_scale=0.125)
        const = dict(BM=backward_config(d).block_m, HEAD_DIM=d)
        options = {}
    elif kind == "gqa":
        args = dict(DK_HEADS=MockTensor(f32), DV_HEADS=MockTensor(f32), DK=MockTensor(dt),
                    DV=MockTensor(dt), **strides("dk", heads_kv), **strides("dv", heads_kv),
                    H_KV=heads_kv, S_K=seqlen, softmax_scale=0.125)
        const = dict(GROUP=group, BN=64, HEAD_DIM=d, HEAD_DIM_V=d)
        options = dict(num_warps=4)
    elif kind == "dq_tiles":
        block_m = v["block_m"]
        args = dict(DQ_ACC=MockTensor(f32), DQ=MockTensor(dt), **strides("dq", heads),
                    H=heads, S_Q=seqlen, N_Q=-(-seqlen // block_m), softmax_scale=0.125)
        const = dict(BM=block_m, HEAD_DIM=d)
        options = {}
    else:
        raise ValueError(kind)
    return fn, args | constants(fn, const), options


def compile_variant(v: dict, spec: str):
    """One variant compiled for sm_90 under specialization ``spec`` (see the docstring)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn, args, options = launch_arguments(v)
    missing = [n for n, p in zip(fn.arg_names, fn.params)
               if n not in args and not p.has_default]
    if missing:
        raise KeyError(f"{fn.__name__}: no value for {missing}")
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    if spec == "launch":  # what JITFunction.run binds and compiles
        kwargs = dict(options, debug=fn.debug or knobs.runtime.debug,
                      instrumentation_mode=knobs.compilation.instrumentation_mode)
        binder = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, kwargs = binder(**args, **kwargs)
        opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                           specialization, kwargs)
        source = ASTSource(fn, signature, constexprs, attrs)
        return triton.compile(source, target=target, options=opts.__dict__)
    # plain: every tensor a pointer of its dtype, every int an i32, nothing assumed
    import torch

    types = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32",
             torch.int32: "*i32"}
    names = fn.arg_names
    const = {n: args[n] for n, p in zip(names, fn.params) if p.is_constexpr and n in args}
    signature = {}
    for n in names:
        if n in const or n not in args:
            signature[n] = "constexpr"
        elif isinstance(args[n], float):
            signature[n] = "fp32"
        elif isinstance(args[n], int):
            signature[n] = "i32"
        else:
            signature[n] = types[args[n].dtype]
    defaults = {n: p.default for n, p in zip(names, fn.params) if n not in args}
    source = ASTSource(fn, signature, constexprs={(names.index(n),): val for n, val in
                                                  (const | defaults).items()})
    return triton.compile(source, target=target, options=options)


def worker(tree: Path, out: Path, shard: int, shards: int, head_dims: tuple[int, ...]) -> int:
    sys.path.insert(0, str(tree))
    import dash_cuda

    if not Path(dash_cuda.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"imported {dash_cuda.__file__}, not the tree {tree}")
    todo = [(v, s) for v in variants(head_dims) for s in SPECS][shard::shards]
    for v, spec in todo:
        try:
            kernel = compile_variant(v, spec)
        except NoSuchKernel:
            continue
        (out / f"{v['name']}-{spec}.ptx").write_text(kernel.asm["ptx"])
    return 0


# -- the CuTe variants -------------------------------------------------------------------------
def cute_key(v) -> str:
    """What a CuTe variant is, in words that do not depend on the tree's naming."""
    dtype = "bf16" if "bfloat16" in str(v.dtype) else "fp16"
    mask = getattr(v, "mask", None) or ("causal" if v.causal else "full")
    mask += "_varlen" if getattr(v, "packed", False) else ""  # packed batches: kernels of their own
    if "Forward" in type(v).__name__:
        return f"fwd_{dtype}_d{v.head_dim}_{mask}_m{v.block_m}"
    flags = "det" if v.deterministic else "atomic"
    flags += "_audit" if v.audit else ""
    flags += "_perhead" if v.per_head else ""
    return f"bwd_{dtype}_d{v.head_dim}_{mask}_{flags}"


def cute_variants() -> dict:
    """The tree's shipped CuTe variants by :func:`cute_key` (diagnostic variants left out)."""
    try:
        from dash_cuda.backends.cute.variants import shipped_variants

        found = shipped_variants()
    except ImportError:  # a tree from before the one list
        from dash_cuda import warmup
        from dash_cuda.backends.cute import inspect_ptx

        found = (inspect_ptx.all_variants()
                 + warmup.cute_variants(["bf16", "fp16"], [64, 128]))
    out: dict = {}
    for v in found:
        if getattr(v, "probe", False) or getattr(v, "dq_add", "bulk") != "bulk":
            continue
        out.setdefault(cute_key(v), v)
    return out


def cute_worker(tree: Path, out: Path, shard: int, shards: int) -> int:
    sys.path.insert(0, str(tree))
    import dash_cuda
    from dash_cuda.backends.cute import inspect_ptx

    if not Path(dash_cuda.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"imported {dash_cuda.__file__}, not the tree {tree}")
    for key, v in sorted(cute_variants().items())[shard::shards]:
        with tempfile.TemporaryDirectory(prefix="compare_ptx_cute_") as folder:
            ptx = inspect_ptx.compile_ptx(v, folder)[1]
        (out / f"{key}.ptx").write_text(ptx)
    return 0


def run_cute_tree(tree: Path, out: Path, jobs: int) -> None:
    procs = [subprocess.Popen([sys.executable, __file__, "--cute-worker", str(tree), str(out),
                               str(shard), str(jobs)],
                              env=dict(os.environ, PYTHONPATH=str(tree)), cwd=tree)
             for shard in range(jobs)]
    failed = [p.args for p in procs if p.wait() != 0]
    if failed:
        raise SystemExit(f"compiling in {tree} failed: {failed}")


def compare_cute(args) -> int:
    with tempfile.TemporaryDirectory(prefix="compare_ptx_") as scratch:
        root = args.keep or Path(scratch)
        dirs = []
        for label, tree in (("base", args.base), ("new", args.new)):
            folder = root / "cute" / label
            folder.mkdir(parents=True, exist_ok=True)
            run_cute_tree(tree.resolve(), folder.resolve(), args.jobs)
            dirs.append(folder)
        names = sorted(p.name for p in dirs[0].iterdir())
        added = sorted({p.name for p in dirs[1].iterdir()} - set(names))
        missing = [name for name in names if not (dirs[1] / name).exists()]
        if missing:
            raise SystemExit(f"the new tree lacks variants of the base: {missing}")
        if added:  # new variants have no PTX to compare with; the base's must all be kept
            print(f"cute: {len(added)} variants only in the new tree (not compared): "
                  + ", ".join(name.removesuffix(".ptx") for name in added))
        same = 0
        for name in names:
            before, after = ((d / name).read_text() for d in dirs)
            if before == after:
                same += 1
                continue
            print(f"DIFFERENT {name}")
            diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "base",
                                        "new", lineterm="", n=1)
            print("\n".join(list(diff)[:40]))
    print(f"cute: {len(names)} variants; {same} identical byte for byte, "
          f"{len(names) - same} different")
    return 0 if same == len(names) else 1


# -- comparing ------------------------------------------------------------------------------
_DEBUG_SECTION = re.compile(r"^\s*\.section\s+\.debug_\w+\s*(?:\{[^}]*\}|\n\s*\{.*?^\s*\})",
                            re.M | re.S)
#: ``.loc``/``.file`` lines, and the ``$L__tmp`` labels that only the debug sections refer to
#: (they mark where inlined functions begin and end; without line info there are none)
_LINE_INFO = re.compile(r"^(?:\s*\.(?:loc|file)\b.*|\$L__tmp\d+:)\n", re.M)


def without_line_info(ptx: str) -> str:
    """The PTX less its ``.loc`` and ``.file`` lines, ``$L__tmp`` labels and
    ``.section .debug_*`` blocks."""
    return _LINE_INFO.sub("", _DEBUG_SECTION.sub("", ptx))


def run_tree(tree: Path, out: Path, jobs: int, line_info: bool, head_dims) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("TRITON_INTERPRET", None)
    if line_info:
        env.pop("TRITON_DISABLE_LINE_INFO", None)
    else:
        env["TRITON_DISABLE_LINE_INFO"] = "1"
    procs = []
    caches = []
    for shard in range(jobs):
        cache = tempfile.TemporaryDirectory(prefix="compare_ptx_cache_")
        caches.append(cache)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--worker", str(tree), str(out), str(shard), str(jobs),
             json.dumps(head_dims)],
            env=dict(env, TRITON_CACHE_DIR=cache.name), cwd=tree))
    failed = [p.args for p in procs if p.wait() != 0]
    for cache in caches:
        cache.cleanup()
    if failed:
        raise SystemExit(f"compiling in {tree} failed: {failed}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--cute-worker":
        tree, out, shard, shards = argv[1:]
        return cute_worker(Path(tree), Path(out), int(shard), int(shards))
    if argv and argv[0] == "--worker":
        tree, out, shard, shards, dims = argv[1:]
        return worker(Path(tree), Path(out), int(shard), int(shards), tuple(json.loads(dims)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["triton", "cute"], required=True)
    parser.add_argument("base", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--line-info", choices=["on", "off", "both"], default="both")
    parser.add_argument("--keep", type=Path, help="write the PTX of both trees under KEEP")
    parser.add_argument("--head-dims", type=int, nargs="*",
                        help="default: config.HEAD_DIMS of the new tree")
    args = parser.parse_args(argv)
    if args.backend == "cute":
        return compare_cute(args)
    head_dims = args.head_dims
    if not head_dims:
        sys.path.insert(0, str(args.new))
        from dash_cuda.backends.triton.config import HEAD_DIMS

        head_dims = list(HEAD_DIMS)
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.line_info]
    with tempfile.TemporaryDirectory(prefix="compare_ptx_") as scratch:
        root = args.keep or Path(scratch)
        total = same = new_only_total = 0
        for line_info in modes:
            mode = "line-info" if line_info else "no-line-info"
            dirs = []
            for label, tree in (("base", args.base), ("new", args.new)):
                folder = root / mode / label
                folder.mkdir(parents=True, exist_ok=True)
                run_tree(tree.resolve(), folder.resolve(), args.jobs, line_info, head_dims)
                dirs.append(folder)
            names = sorted(p.name for p in dirs[0].iterdir())
            new_only = sorted({p.name for p in dirs[1].iterdir()} - set(names))
            if not set(names) <= {p.name for p in dirs[1].iterdir()}:
                raise SystemExit("the new tree did not compile every variant of the base tree")
            new_only_total += len(new_only)
            if new_only:
                kinds = sorted({n.split("-")[0] + " " + next(
                    (part for part in n.split("-") if part.startswith("mask=")), "")
                    for n in new_only})
                print(f"{mode}: {len(new_only)} kernels compiled in the new tree only (the base "
                      f"tree has no kernel for them: {', '.join(kinds)})")
            raw_same = mode_same = 0
            for name in names:
                before, after = ((d / name).read_text() for d in dirs)
                raw_same += before == after
                if line_info:
                    before, after = without_line_info(before), without_line_info(after)
                if before == after:
                    mode_same += 1
                    continue
                print(f"DIFFERENT [{mode}] {name}")
                diff = difflib.unified_diff(before.splitlines(), after.splitlines(), "base",
                                            "new", lineterm="", n=1)
                print("\n".join(list(diff)[:40]))
            how = ("after leaving out .loc/.file lines, $L__tmp labels and .debug sections"
                   if line_info else "byte for byte")
            print(f"{mode}: {len(names)} kernels compared, {mode_same} identical {how} "
                  f"({raw_same} identical byte for byte)")
            total += len(names)
            same += mode_same
    print(f"{args.backend}: {len(variants(tuple(head_dims)))} variants x {len(SPECS)} "
          f"specializations x {len(modes)} line-info settings; {total} PTX texts compared "
          f"({new_only_total} in the new tree only); {same} identical, {total - same} different")
    return 0 if same == total else 1


if __name__ == "__main__":
    raise SystemExit(main())
