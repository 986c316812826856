#!/usr/bin/env python3
"""Check the tensor-core model (dash_ref.arithmetic.tensorcore) against ``tl.dot`` bit for bit.

Builds the seeded test set of `scripts/mma_cases.py` for bf16 and fp16, runs every tile
through small Triton kernels built around ``acc = tl.dot(a, b, acc)`` with an fp32
accumulator (default ``input_precision``), and compares each output's 32 bits with
:func:`dash_ref.arithmetic.tensorcore.mma_bits` (k16 steps, ascending).  Kernels:

==============  =============================================================================
``k16``         one 16x16x16 tile per program, ``C`` loaded: a single k16 step
``k16_noacc``   the same tiles without ``C`` (``tl.dot`` from a zero accumulator)
``k64``         one 64x64x64 tile per program, a single ``tl.dot`` over ``K = 64``
``k64_loop16``  the same tiles, four ``tl.dot`` calls of ``K = 16`` in a loop
``k64_loop32``  the same tiles, two ``tl.dot`` calls of ``K = 32``
``k64_w8``      ``k64`` with 8 warps
``k64_noacc``   ``k64`` without ``C`` (the first ``wgmma`` then runs with ``C`` disabled)
==============  =============================================================================

The model (``HOPPER``) is the same for ``mma.sync`` and ``wgmma``: the H200 run of
``benchmarks/results/mma_validation/`` showed both instructions follow one set of rules.
Besides the model it scores every alternative reading in ``CANDIDATES`` (``mma_sim`` is
MMA-Sim's, this model's reading before that run; ``floor_m132``/``floor_m134`` and
``zero_exclude_floor_m133``, i.e. a rounded zero keeping its sign, bracket the rules the
run settled), ``C`` added by a separate fp32 add (``c_separate_add``) and, for the K = 64
kernels, other chainings (one fused 32- or 64-term step, descending order), so a mismatch
points at the rule that differs.
It saves the PTX of each kernel and counts its tensor-core instructions (``mma.sync`` or
``wgmma``), which shows how Triton splits ``K``.

Run on the GPU from the repository root::

    PYTHONPATH=. python3 scripts/validate_mma.py --out /tmp/mma_validation

Smoke test of the plumbing on a CPU (the interpreter's dot is NumPy's, so the mismatch
counts mean nothing there)::

    TRITON_INTERPRET=1 PYTHONPATH=. python3 scripts/validate_mma.py --count 64 --count64 2 \\
        --out /tmp/mma_smoke

Writes ``validate_mma.json`` (everything), ``summary.md`` (the tables), ``mismatches.txt``
(the first differing elements with their inputs) and ``ptx/`` to ``--out``; prints the
tables last.  Exit status 0 when the model matches every output (always 0 under the
interpreter), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl
from mma_cases import DEFAULT_COUNT, FAMILIES, MMACases, generate

from dash_ref.arithmetic.tensorcore import CANDIDATES, HOPPER, mma_bits

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _tile_dot_kernel(a_ptr, b_ptr, c_ptr, d_ptr, M: tl.constexpr, N: tl.constexpr,
                     K: tl.constexpr, BLOCK_K: tl.constexpr, LOAD_C: tl.constexpr):
    t = tl.program_id(0)
    rm = tl.arange(0, M)
    rn = tl.arange(0, N)
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + t * (M * K)
    b_tile = b_ptr + t * (K * N)
    cd = t * (M * N) + rm[:, None] * N + rn[None, :]
    if LOAD_C:  # noqa: SIM108 (a constexpr branch)
        acc = tl.load(c_ptr + cd)
    else:
        acc = tl.zeros((M, N), dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        a = tl.load(a_tile + rm[:, None] * K + (k0 + rk)[None, :])
        b = tl.load(b_tile + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, b, acc)
    tl.store(d_ptr + cd, acc)


# name -> (test set, BLOCK_K, LOAD_C, num_warps)
KERNELS = {
    "k16": ("16", 16, True, 4),
    "k16_noacc": ("16", 16, False, 4),
    "k64": ("64", 64, True, 4),
    "k64_loop16": ("64", 16, True, 4),
    "k64_loop32": ("64", 32, True, 4),
    "k64_w8": ("64", 64, True, 8),
    "k64_noacc": ("64", 64, False, 4),
}
CHAINS = {"chain_k32": (32, "ascending"), "chain_k64": (64, "ascending"),
          "chain_descending": (16, "descending")}
_MMA_RE = re.compile(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)")

# the test sets, shared with the worker processes (forked before CUDA is touched)
_STATE: dict = {}


# ---------------------------------------------------------------------------------------
# GPU side
# ---------------------------------------------------------------------------------------
def run_kernel(cases: MMACases, block_k: int, load_c: bool, num_warps: int, device: str):
    """Outputs of the Triton kernel as fp32 bits ``[T, M, N]``, and the compiled handle."""
    a, b, c = (x.to(device) for x in cases.tensors())
    m, n, k = cases.shape
    d = torch.empty_like(c)
    handle = _tile_dot_kernel[(len(cases),)](a, b, c, d, M=m, N=n, K=k, BLOCK_K=block_k,
                                             LOAD_C=load_c, num_warps=num_warps)
    if device != "cpu":
        torch.cuda.synchronize()
    return d.cpu().view(torch.int32).numpy().view(np.uint32).copy(), handle


def ptx_summary(handle, path: Path) -> dict:
    """Tensor-core instructions in the kernel's PTX, in order of first appearance."""
    asm = getattr(handle, "asm", None) or {}
    ptx = asm.get("ptx") if hasattr(asm, "get") else None
    if not ptx:
        return {"available": False}
    path.write_text(ptx)
    found = _MMA_RE.findall(ptx)
    return {"available": True, "instructions": dict(Counter(found)), "total": len(found),
            "file": str(path)}


# ---------------------------------------------------------------------------------------
# model side (CPU, in parallel)
# ---------------------------------------------------------------------------------------
def _model(dtype: str, which: str, load_c: bool, variant: str, k_step: int = 16,
           order: str = "ascending") -> np.ndarray:
    cases: MMACases = _STATE["cases"][(dtype, which)]
    c = cases.c_bits if load_c else None
    if variant == "c_separate_add":  # products from +0, then one fp32 (RNE) add of C
        d = mma_bits(cases.a_bits, cases.b_bits, None, dtype, k_step, order, HOPPER)
        if load_c:
            with np.errstate(all="ignore"):
                d = (d.view(np.float32) + c.view(np.float32)).view(np.uint32)
        return d
    return mma_bits(cases.a_bits, cases.b_bits, c, dtype, k_step, order, CANDIDATES[variant])


def _model_task(args):
    return args, _model(*args)


def _score_task(task):
    """Mismatches of one alternative against the GPU outputs of the kernels sharing its data
    (``task = (model arguments, {kernel: GPU bits})``)."""
    args, outputs = task
    pred = _model(*args)
    return args, {name: int(np.count_nonzero(pred != got)) for name, got in outputs.items()}


def _pool(jobs: int):
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    return ctx.Pool(processes=jobs)


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------
def _ordered(bits: np.ndarray) -> np.ndarray:
    b = bits.astype(np.int64)
    return np.where(b >> 31, -(b & 0x7FFFFFFF), b & 0x7FFFFFFF)


def _is_nan(bits: np.ndarray) -> np.ndarray:
    return ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)


def compare(got: np.ndarray, want: np.ndarray, cases: MMACases) -> dict:
    diff = got != want
    both_nan = _is_nan(got) & _is_nan(want)
    finite = ((got & 0x7F800000) != 0x7F800000) & ((want & 0x7F800000) != 0x7F800000)
    ulps = np.abs(_ordered(got) - _ordered(want))[diff & finite]
    per_tile = diff.reshape(len(cases), -1).sum(axis=1)
    by_family = {}
    for i, fam in enumerate(FAMILIES):
        sel = cases.family == i
        if sel.any():
            by_family[fam] = {"tiles": int(sel.sum()), "outputs": int(diff[sel].size),
                              "mismatches": int(per_tile[sel].sum()),
                              "tiles_with_mismatch": int((per_tile[sel] > 0).sum())}
    return {
        "tiles": len(cases), "outputs": int(diff.size), "mismatches": int(diff.sum()),
        "nan_payload_only": int((diff & both_nan).sum()),
        "nonfinite_mismatches": int((diff & ~finite & ~both_nan).sum()),
        "max_ulp": int(ulps.max()) if ulps.size else 0,
        "tiles_with_mismatch": int((per_tile > 0).sum()),
        "by_family": by_family,
    }


def _value(bits) -> float | str:
    x = float(np.array(bits, np.uint32).view(np.float32))
    return x if np.isfinite(x) else str(x)


def examples(got, want, cases: MMACases, load_c: bool, limit: int) -> list[dict]:
    """The first ``limit`` differing elements, with their inputs and every candidate's bits."""
    out = []
    t_idx, i_idx, j_idx = np.nonzero(got != want)
    tiles: dict[int, dict[str, np.ndarray]] = {}  # candidate outputs of a few tiles
    for t, i, j in list(zip(t_idx, i_idx, j_idx))[:limit]:
        if t not in tiles and len(tiles) < 8:
            a = cases.a_bits[t:t + 1]
            b = cases.b_bits[t:t + 1]
            c = cases.c_bits[t:t + 1] if load_c else None
            tiles[t] = {name: mma_bits(a, b, c, cases.dtype, config=cfg)[0]
                        for name, cfg in CANDIDATES.items()}
        preds = {name: f"{int(d[i, j]):08x}" for name, d in tiles.get(t, {}).items()}
        out.append({**mismatch_row(got, want, cases, load_c, t, i, j), "candidates": preds})
    return out


def mismatch_row(got, want, cases: MMACases, load_c: bool, t, i, j) -> dict:
    """One mismatching output: where, which family, both bit patterns and the inputs."""
    return {
        "tile": int(t), "row": int(i), "col": int(j),
        "family": FAMILIES[int(cases.family[t])],
        "gpu": f"{int(got[t, i, j]):08x}", "model": f"{int(want[t, i, j]):08x}",
        "gpu_value": _value(got[t, i, j]), "model_value": _value(want[t, i, j]),
        "a_row": " ".join(f"{int(x):04x}" for x in cases.a_bits[t, i]),
        "b_col": " ".join(f"{int(x):04x}" for x in cases.b_bits[t, :, j]),
        "c": f"{int(cases.c_bits[t, i, j]):08x}" if load_c else "none (+0)",
    }


# ---------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------
def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "triton": triton.__version__, "numpy": np.__version__, "interpret": INTERPRET,
           "device": device, "host": platform.node()}
    if device != "cpu":
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cuda"] = torch.version.cuda
    try:
        root = Path(__file__).resolve().parent.parent
        env["git_revision"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
            timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        env["git_revision"] = "unknown"
    return env


def tables(report: dict) -> str:
    lines = ["## MMA model vs tl.dot (bit for bit)", "",
             "| kernel | dtype | tiles | outputs | mismatches | NaN payload only | max ulp |"
             " tensor-core instructions |", "|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        ptx = r.get("ptx", {})
        instr = ", ".join(f"{v}x {k}" for k, v in ptx.get("instructions", {}).items()) \
            if ptx.get("available") else "n/a"
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['tiles']} | {r['outputs']} | "
                     f"{r['mismatches']} | {r['nan_payload_only']} | {r['max_ulp']} | {instr} |")
    fams = sorted({f for r in report["results"] for f in r["by_family"]},
                  key=FAMILIES.index)
    lines += ["", "### mismatching outputs per case family", "",
              "| kernel/dtype | " + " | ".join(fams) + " |",
              "|---|" + "---|" * len(fams)]
    for r in report["results"]:
        cells = [str(r["by_family"].get(f, {}).get("mismatches", "-")) for f in fams]
        lines.append(f"| {r['kernel']}/{r['dtype']} | " + " | ".join(cells) + " |")
    if report.get("variants"):
        cols = [f"{r['kernel']}/{r['dtype']}" for r in report["results"]]
        lines += ["", "### alternative readings: mismatching outputs (0 = consistent)", "",
                  "| variant | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        for name, per in report["variants"].items():
            lines.append(f"| {name} | " + " | ".join(str(per.get(c, "-")) for c in cols) + " |")
        lines += ["", "consistent with every kernel: " +
                  (", ".join(report["consistent_variants"]) or "none")]
    t = report["total"]
    lines += ["", f"**total: {t['mismatches']} mismatching outputs of {t['outputs']} "
              f"({t['tiles']} tiles){' [interpreter: meaningless]' if INTERPRET else ''}**"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the JSON, tables, PTX and logs")
    ap.add_argument("--count", type=int, default=DEFAULT_COUNT,
                    help="16x16x16 tiles per dtype (default %(default)s)")
    ap.add_argument("--count64", type=int, default=256,
                    help="64x64x64 tiles per dtype (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--kernels", default=",".join(KERNELS))
    ap.add_argument("--no-variants", action="store_true", help="skip the alternative readings")
    ap.add_argument("--examples", type=int, default=20, help="mismatches kept per kernel")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="CPU processes for the model (default: all cores)")
    args = ap.parse_args(argv)

    device = "cpu" if INTERPRET else "cuda"
    if not INTERPRET and not torch.cuda.is_available():
        print("no CUDA device; set TRITON_INTERPRET=1 for a CPU smoke test", file=sys.stderr)
        return 2
    out = Path(args.out)
    (out / "ptx").mkdir(parents=True, exist_ok=True)
    dtypes = [d for d in args.dtypes.split(",") if d]
    kernels = [k for k in args.kernels.split(",") if k]
    for k in kernels:
        if k not in KERNELS:
            ap.error(f"unknown kernel {k!r}; known: {', '.join(KERNELS)}")
    t0 = time.time()

    # test sets
    sets: dict[tuple[str, str], MMACases] = {}
    for dt in dtypes:
        sets[(dt, "16")] = generate(dt, args.count, args.seed, (16, 16, 16))
        sets[(dt, "64")] = generate(dt, args.count64, args.seed, (64, 64, 64))
    _STATE["cases"] = sets
    print(f"test sets built in {time.time() - t0:.1f} s: " + ", ".join(
        f"{dt}/{w}: {len(c)} tiles" for (dt, w), c in sets.items()), flush=True)

    # CPU workers for the model, started before CUDA is initialised; the model of every
    # kernel's data runs while the GPU works
    pool = _pool(max(1, args.jobs))
    needed = sorted({(dt, KERNELS[k][0], KERNELS[k][2]) for dt in dtypes for k in kernels
                     if len(sets[(dt, KERNELS[k][0])])})
    model_async = pool.map_async(_model_task, [(dt, w, lc, "hopper") for dt, w, lc in needed])

    # GPU runs
    gpu: dict[tuple[str, str], np.ndarray] = {}
    ptx: dict[tuple[str, str], dict] = {}
    for dt in dtypes:
        for name in kernels:
            which, block_k, load_c, warps = KERNELS[name]
            cases = sets[(dt, which)]
            if len(cases) == 0:
                continue
            t1 = time.time()
            gpu[(name, dt)], handle = run_kernel(cases, block_k, load_c, warps, device)
            ptx[(name, dt)] = ptx_summary(handle, out / "ptx" / f"{name}_{dt}.ptx")
            print(f"ran {name}/{dt} in {time.time() - t1:.1f} s", flush=True)

    # the alternatives, scored in parallel on the CPU
    t1 = time.time()
    score_tasks = []
    if not args.no_variants:
        for dt, w, lc in needed:
            outputs = {k: gpu[(k, dt)] for k in kernels
                       if KERNELS[k][0] == w and KERNELS[k][2] == lc and (k, dt) in gpu}
            specs = [(v, 16, "ascending") for v in CANDIDATES if v != "hopper"]
            if lc:
                specs.append(("c_separate_add", 16, "ascending"))
            if w == "64":
                specs += [("hopper", ks, order) for ks, order in CHAINS.values()]
            score_tasks += [((dt, w, lc, v, ks, order), outputs) for v, ks, order in specs]
    scores = pool.map(_score_task, score_tasks) if score_tasks else []
    model = {key[:3]: pred for key, pred in model_async.get()}
    pool.close()
    pool.join()
    print(f"model and {len(score_tasks)} alternatives in {time.time() - t1:.1f} s", flush=True)

    results = []
    for (name, dt), got in gpu.items():
        which, block_k, load_c, warps = KERNELS[name]
        cases = sets[(dt, which)]
        want = model[(dt, which, load_c)]
        res = {"kernel": name, "dtype": dt, "shape": list(cases.shape), "block_k": block_k,
               "load_c": load_c, "num_warps": warps, **compare(got, want, cases),
               "ptx": ptx[(name, dt)]}
        res["examples"] = examples(got, want, cases, load_c, args.examples)
        results.append(res)

    variants: dict[str, dict[str, int]] = {}
    for (dt, _w, _lc, v, ks, order), per in scores:
        label = v if (ks, order) == (16, "ascending") else next(
            n for n, spec in CHAINS.items() if spec == (ks, order))
        for kern, count in per.items():
            variants.setdefault(label, {})[f"{kern}/{dt}"] = count
    base = {f"{r['kernel']}/{r['dtype']}": r["mismatches"] for r in results}
    ordered = {"hopper (model)": base}
    for name in [*CANDIDATES, "c_separate_add", *CHAINS]:
        if name in variants:
            ordered[name] = variants[name]
    consistent = [n for n, per in ordered.items() if per and not any(per.values())]

    total = {"tiles": sum(len(sets[(dt, KERNELS[k][0])]) for (k, dt) in gpu),
             "outputs": sum(r["outputs"] for r in results),
             "mismatches": sum(r["mismatches"] for r in results)}
    report = {
        "command": " ".join([sys.executable, *sys.argv]),
        "environment": environment(device),
        "seed": args.seed,
        "model": {**dataclasses.asdict(HOPPER), "k_step": 16, "order": "ascending"},
        "test_sets": {f"{dt}/{w}": {"shape": list(c.shape), "tiles": len(c),
                                     "families": c.counts(), "fingerprint": c.fingerprint()}
                      for (dt, w), c in sets.items()},
        "results": results,
        "variants": ordered if score_tasks else {},
        "consistent_variants": consistent if score_tasks else [],
        "total": total,
        "pass": total["mismatches"] == 0,
        "seconds": round(time.time() - t0, 1),
    }
    (out / "validate_mma.json").write_text(json.dumps(report, indent=1))
    with open(out / "mismatches.txt", "w") as f:
        for r in results:
            for ex in r["examples"]:
                f.write(f"{r['kernel']}/{r['dtype']} {json.dumps(ex)}\n")
    text = tables(report)
    (out / "summary.md").write_text(text + "\n")
    print()
    print(text)
    print(f"\nfull report: {out / 'validate_mma.json'}  ({report['seconds']} s)")
    if INTERPRET:
        print("TRITON_INTERPRET=1: the interpreter's dot is not the tensor core; "
              "only the plumbing was tested.")
        return 0
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
