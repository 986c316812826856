#!/usr/bin/env python3
"""Check the tensor-core model against the ``wgmma`` forms the CuTe kernels issue, bit for bit.

``scripts/validate_mma.py`` checks :mod:`dash_ref.arithmetic.tensorcore` through Triton's
``tl.dot`` (both operands from shared memory, as Triton lays them out). This script runs the
seeded tiles of `scripts/mma_cases.py`, shaped 64 x K x N, through a one-warpgroup CuTe DSL
kernel (`scripts/wgmma_kernel.py`) that issues ``wgmma.m64nNk16`` with the operand sources,
majorness and shared-memory layouts of ``dash_cuda/backends/cute`` (``layouts.gemm``,
``smem_layout``, ``acc_as_operand_a``, ``transposed``), and compares every output's 32 bits
with :func:`dash_ref.arithmetic.tensorcore.mma_bits` (k16 steps, ascending) exactly as
validate_mma.py does (its ``compare`` and ``examples``).

Variants (96): operand form x N x K x dtype x C:

* form ``ss_kk`` (A, B from shared memory, K-major: S = Q K^T, S^T = K Q^T, dP^T = V dO^T),
  ``rs_mn`` (A from registers through ``acc_as_operand_a``, B MN-major: acc += P V,
  dV += P^T dO, dK += dS^T Q), ``ss_mn`` (A shared MN-major, B MN-major: dQ = dS K);
* N in {64, 128} with K in {16, 64, 128} (head dims 64 and 128), and the six (form, N, K)
  of head dim 96 (``wgmma_kernel.D96_FORMS``: K = 96, N = 96 and 48); bf16, fp16;
* ``C`` loaded into the accumulator (every wgmma accumulates) or not (the first k16 block
  runs with scale-d = 0, as the kernels' fresh accumulators do).

Export every variant on a CPU (no GPU; CuTe DSL compiles for sm_90a), checking each one's
PTX (``wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16`` / ``.f16.f16``, K / 16 of
them, register A as a ``{...}`` list, shared A as a descriptor, the transpose immediates,
scale-d off on the first block exactly when there is no C, no floating-point ``cvt``) and
that the register A holds, thread by thread, what CuTe's ``partition_A`` of the register-A
MMA says the wgmma reads (``wgmma_kernel.register_a_check``)::

    PYTHONPATH=. python3 scripts/validate_wgmma.py --export .wgmma_aot

The objects are written and loaded as ``python -m dash_cuda.warmup --cute-aot`` and
``DASH_CUTE_AOT_DIR`` do (``launch.export_kernel`` / ``launch.load_exported``, TVM-FFI entry,
``launch.COMPILE_OPTIONS``); one that does not load is compiled instead. Run on the GPU
from the repository root (``--jobs``: CPU processes for the model, which runs meanwhile)::

    PYTHONPATH=. python3 scripts/validate_wgmma.py --aot .wgmma_aot --out /tmp/wgmma --jobs 16

Smoke test of the comparison plumbing on a CPU (the model's own outputs as "hardware": 0
mismatches, then one flipped bit: 1)::

    PYTHONPATH=. python3 scripts/validate_wgmma.py --self-test

Writes ``validate_wgmma.json`` (everything), ``summary.md`` (the table and the first
mismatches) and ``mismatches.txt`` to ``--out``; prints the table last. Exit status 0 when
the model matches every output, 1 otherwise, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

_SCRIPTS = Path(__file__).resolve().parent
for _p in (str(_SCRIPTS.parent), str(_SCRIPTS)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from mma_cases import FAMILIES, MMACases, generate  # noqa: E402

from dash_ref.arithmetic.tensorcore import HOPPER, mma_bits  # noqa: E402

#: tiles per (dtype, N, K) set, by K: about the same number of products per set
DEFAULT_TILES = {16: 1024, 64: 256, 96: 170, 128: 128}
MANIFEST = "wgmma_manifest.json"
_STATE: dict = {}  # the test sets, shared with the forked model workers


# ---------------------------------------------------------------------------------------
# variants (the CuTe side is imported only where it is needed)
# ---------------------------------------------------------------------------------------
def _kernels():
    import wgmma_kernel

    return wgmma_kernel


def select_variants(only: str | None, dtypes: list[str]) -> list:
    """Every variant of ``wgmma_kernel.all_variants()`` in ``dtypes`` whose name contains
    one of the comma-separated substrings of ``only``."""
    pats = [p for p in (only or "").split(",") if p]
    return [v for v in _kernels().all_variants() if v.dtype in dtypes
            and (not pats or any(p in v.name for p in pats))]


# ---------------------------------------------------------------------------------------
# PTX facts
# ---------------------------------------------------------------------------------------
_WGMMA_RE = re.compile(
    r"(wgmma\.mma_async[\w.]*)\s+\{([^}]*)\},\s*(\{[^}]*\}|%rd\d+),\s*(%rd\d+),\s*([^;]*);")


def _scale_d(lines: list[str], at: int) -> int | None:
    """The value of the scale-d predicate's source register of the wgmma on line ``at``:
    ``setp.ne.b32 p, %rN, 0`` in its inline-asm block, ``%rN`` an immediate ``mov``."""
    reg = None
    for i in range(at - 1, max(-1, at - 8), -1):
        m = re.search(r"setp\.ne\.b32\s+p,\s*(%r\d+),\s*0;", lines[i])
        if m:
            reg, at = m.group(1), i
            break
    if reg is None:
        return None
    for i in range(at - 1, -1, -1):
        m = re.search(rf"mov\.b32\s+{re.escape(reg)},\s*(-?\d+);", lines[i])
        if m:
            return int(m.group(1))
    return None


def wgmma_instructions(ptx: str) -> list[dict]:
    """Each ``wgmma.mma_async`` of ``ptx``: opcode, accumulator count, A form, the trailing
    immediates and the scale-d value (None where it is not an immediate)."""
    lines = ptx.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "wgmma.mma_async" not in line:
            continue
        m = _WGMMA_RE.search(line)
        if not m:
            out.append({"opcode": None, "line": line.strip()[:200]})
            continue
        a = m.group(3)
        out.append({
            "opcode": m.group(1),
            "accumulators": len([r for r in m.group(2).split(",") if r.strip()]),
            "a_form": "registers" if a.startswith("{") else "descriptor",
            "a_registers": len(a.strip("{}").split(",")) if a.startswith("{") else 0,
            "immediates": [s.strip() for s in m.group(5).split(",")],
            "scale_d": _scale_d(lines, i),
        })
    return out


def check_ptx(ptx: str, v) -> list[str]:
    """What ``v``'s PTX must show; a list of failures (empty: all hold)."""
    bad = []
    found = wgmma_instructions(ptx)
    if len(found) != v.k // 16:
        bad.append(f"{len(found)} wgmma.mma_async, expected K / 16 = {v.k // 16}")
    for j, w in enumerate(found):
        if w["opcode"] != v.instruction:
            bad.append(f"wgmma {j}: {w['opcode'] or w['line']!r}, expected {v.instruction}")
            continue
        if w["accumulators"] != v.n // 2:
            bad.append(f"wgmma {j}: {w['accumulators']} accumulator registers, expected "
                       f"{v.n // 2}")
        want_form = "registers" if v.a_in_registers else "descriptor"
        if w["a_form"] != want_form or (v.a_in_registers and w["a_registers"] != 4):
            bad.append(f"wgmma {j}: A as {w['a_form']} ({w['a_registers']} registers), "
                       f"expected {want_form}")
        # p, scale-a, scale-b[, tnspA], tnspB (no tnspA for a register A)
        want = ["p", "1", "1"] + ([] if v.a_in_registers else [str(int(v.transpose_a))]) \
            + [str(int(v.transpose_b))]
        if w["immediates"] != want:
            bad.append(f"wgmma {j}: operands after B {w['immediates']}, expected {want}")
        want_scale = 0 if (j == 0 and not v.load_c) else 1
        if w["scale_d"] != want_scale:
            bad.append(f"wgmma {j}: scale-d {w['scale_d']}, expected {want_scale}")
    conversions = sorted(set(re.findall(r"\bcvt(?:\.\w+)*\.b?f(?:16|32)\b[\w.]*", ptx)))
    if conversions:  # the operands and C must reach the wgmma, and D memory, bit for bit
        bad.append(f"floating-point conversions: {conversions}")
    for fence in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                  "wgmma.wait_group.sync.aligned"):
        if fence not in ptx:
            bad.append(f"no {fence}")
    return bad


def compile_variant(v, ptx_dir: str | None = None):
    """``(compiled kernel, PTX text or None, seconds)``, with ``dash_cuda``'s compile options
    (sm_90a, TVM-FFI entry); the PTX is kept in ``ptx_dir`` when given."""
    from dash_cuda.backends.cute import launch

    opts = ""
    if ptx_dir:
        os.makedirs(ptx_dir, exist_ok=True)
        for f in os.listdir(ptx_dir):
            if f.endswith(".ptx"):
                os.remove(os.path.join(ptx_dir, f))
        opts = f"--keep-ptx --dump-dir={ptx_dir}"
    t0 = time.time()
    with warnings.catch_warnings():  # the kernel's fully unrolled register loops
        warnings.filterwarnings("ignore", message="This static loop has")
        kernel = launch.compile_object(v.kernel_object(), v.placeholder_args(), opts)
    seconds = time.time() - t0
    ptx = None
    if ptx_dir:
        files = sorted(f for f in os.listdir(ptx_dir) if f.endswith(".ptx"))
        if files:
            ptx = Path(ptx_dir, files[0]).read_text()
    return kernel, ptx, seconds


def _export_one(args):
    """Compile one variant keeping its PTX, check it, export ``DIR/<name>.o`` (spawned)."""
    name, folder = args
    from dash_cuda.backends.cute import launch

    v = next(x for x in _kernels().all_variants() if x.name == name)
    try:
        kernel, ptx, seconds = compile_variant(v, os.path.join(folder, "ptx", name))
        t0 = time.time()
        launch.export_kernel(kernel, folder, name)
        bad = check_ptx(ptx, v) if ptx else ["no PTX kept"]
        return {"name": name, "compile_s": round(seconds, 2),
                "export_s": round(time.time() - t0, 2), "ptx_ok": not bad, "ptx_failures": bad,
                "wgmma": wgmma_instructions(ptx) if ptx else []}
    except Exception as e:  # noqa: BLE001 - report and go on with the other variants
        return {"name": name, "error": f"{type(e).__name__}: {str(e)[:800]}", "ptx_ok": False,
                "ptx_failures": ["compile/export failed"]}


def export_all(variants, folder: str, jobs: int) -> int:
    """``--export``: every variant as ``FOLDER/<name>.o`` (what ``--aot`` loads), its PTX in
    ``FOLDER/ptx/<name>/`` and the checks in ``FOLDER/wgmma_manifest.json``."""
    import importlib.metadata

    os.makedirs(folder, exist_ok=True)
    t0 = time.time()
    todo = [(v.name, folder) for v in variants]
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            rows = list(pool.imap(_export_one, todo))
    else:
        rows = [_export_one(t) for t in todo]
    failures = 0
    for r in rows:
        ok = r["ptx_ok"] and "error" not in r
        failures += not ok
        summary = r.get("error") or "; ".join(r["ptx_failures"]) or (
            f"{len(r['wgmma'])}x {r['wgmma'][0]['opcode']} A={r['wgmma'][0]['a_form']}"
            if r["wgmma"] else "")
        print(f"{r['name']:40s} {'OK  ' if ok else 'FAIL'} {r.get('compile_s', 0):5.2f}s  "
              f"{summary}", flush=True)
    seconds = time.time() - t0
    try:
        version = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    # the register A: what the kernel writes where the wgmma reads it (CuTe's partition_A)
    ks = sorted({v.k for v in variants if v.a_in_registers})
    register_a = {k: _kernels().register_a_check(k) for k in ks}
    for k, bad in register_a.items():
        print(f"register A (acc_as_operand_a) vs partition_A, K={k}: "
              f"{'OK' if not bad else 'FAIL: ' + bad[0]}")
        failures += bool(bad)
    manifest = {"cutlass_dsl": version, "seconds": round(time.time() - t0, 1),
                "variants": rows, "register_a_check": {str(k): b for k, b in register_a.items()}}
    Path(folder, MANIFEST).write_text(json.dumps(manifest, indent=1))
    print(f"exported {len(rows)} variants to {folder} in {seconds:.1f} s "
          f"({manifest['seconds']} s with the register-A check); "
          f"{'all checks passed' if not failures else f'{failures} FAILED'}")
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------
# model side (CPU, in parallel)
# ---------------------------------------------------------------------------------------
def _model_task(task):
    """``task = ((dtype, N, K), load_c, lo, hi)``: the model over tiles ``[lo, hi)``."""
    key, load_c, lo, hi = task
    cases: MMACases = _STATE["cases"][key]
    c = cases.c_bits[lo:hi] if load_c else None
    return task, mma_bits(cases.a_bits[lo:hi], cases.b_bits[lo:hi], c, cases.dtype, 16,
                          "ascending", HOPPER)


def model_tasks(sets: dict, needed, chunk_products: int = 1 << 24) -> list:
    tasks = []
    for key, load_c in needed:
        cases = sets[key]
        m, n, k = cases.shape
        step = max(1, chunk_products // (m * n * k))
        tasks += [(key, load_c, lo, min(lo + step, len(cases)))
                  for lo in range(0, len(cases), step)]
    return tasks


def assemble(results, sets: dict) -> dict:
    """Chunks of :func:`_model_task` back into ``{(key, load_c): bits [T, M, N]}``."""
    parts: dict = {}
    for (key, load_c, lo, _hi), bits in results:
        parts.setdefault((key, load_c), []).append((lo, bits))
    return {kl: np.concatenate([b for _, b in sorted(p, key=lambda x: x[0])])
            for kl, p in parts.items()}


def _pool(jobs: int):
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    return ctx.Pool(processes=jobs)


# ---------------------------------------------------------------------------------------
# GPU side
# ---------------------------------------------------------------------------------------
def load_kernel(v, aot: str | None, ptx_dir: str):
    """``(callable, how)``: ``AOT/<name>.o`` loaded as ``DASH_CUTE_AOT_DIR`` loads the
    kernels (``launch.load_exported``), else compiled here (PTX kept in ``ptx_dir``)."""
    from dash_cuda.backends.cute import launch

    if aot and os.path.exists(os.path.join(aot, v.name + ".o")):
        try:
            return launch.load_exported(aot, v.name), "aot"
        except Exception as exc:  # noqa: BLE001 - an unloadable object: compile instead
            print(f"could not load {v.name} from {aot} ({exc}); compiling it", flush=True)
    kernel, _, _ = compile_variant(v, ptx_dir)
    return kernel, "compiled"


def run_variant(kernel, cases: MMACases, torch) -> np.ndarray:
    """The kernel's outputs for every tile of ``cases``, as fp32 bits ``[T, 64, N]``."""
    a, b, c = (x.cuda() for x in cases.tensors())
    d = torch.empty_like(c)
    d.view(torch.int32).fill_(-1)  # all ones: an output never written is a mismatch
    stream = torch.cuda.current_stream().cuda_stream
    kernel(a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), len(cases), stream)
    torch.cuda.synchronize()
    return d.cpu().view(torch.int32).numpy().view(np.uint32).copy()


# ---------------------------------------------------------------------------------------
# reporting
# ---------------------------------------------------------------------------------------
def tables(report: dict) -> str:
    lines = ["## Tensor-core model vs the CuTe kernels' wgmma forms (bit for bit)", "",
             "| variant | form | N | K | dtype | C | tiles | outputs | mismatches |"
             " NaN payload only | max ulp | wgmma (PTX) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        ptx = r.get("ptx") or {}
        instr = (f"{ptx['count']}x m64n{r['n']}k16, A {ptx['a_form']}"
                 + ("" if ptx.get("ok") else " (check FAILED)")) if ptx.get("count") else "n/a"
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['op']} | {r['n']} | {r['k']} | {r['dtype']} "
                         f"| {'yes' if r['load_c'] else 'no'} | - | - | ERROR | - | - | "
                         f"{r['error'][:80]} |")
            continue
        lines.append(f"| {r['variant']} | {r['op']} | {r['n']} | {r['k']} | {r['dtype']} | "
                     f"{'yes' if r['load_c'] else 'no'} | {r['tiles']} | {r['outputs']} | "
                     f"{r['mismatches']} | {r['nan_payload_only']} | {r['max_ulp']} | "
                     f"{instr} |")
    ok = [r for r in report["results"] if "error" not in r]
    fams = sorted({f for r in ok for f in r["by_family"]}, key=FAMILIES.index)
    bad = [r for r in ok if r["mismatches"]]
    if bad:
        lines += ["", "### mismatching outputs per case family", "",
                  "| variant | " + " | ".join(fams) + " |", "|---|" + "---|" * len(fams)]
        for r in bad:
            cells = [str(r["by_family"].get(f, {}).get("mismatches", "-")) for f in fams]
            lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
        lines += ["", "### first mismatches", "",
                  "| variant | tile | row | col | family | gpu | model | C |",
                  "|---|---|---|---|---|---|---|---|"]
        shown = 0
        for r in bad:
            for ex in r["examples"][:5]:
                if shown >= 40:
                    break
                lines.append(f"| {r['variant']} | {ex['tile']} | {ex['row']} | {ex['col']} | "
                             f"{ex['family']} | {ex['gpu']} | {ex['model']} | {ex['c']} |")
                shown += 1
    t = report["total"]
    lines += ["", f"**total: {t['mismatches']} mismatching outputs of {t['outputs']} "
              f"({t['variants']} variants, {t['errors']} failed to run)"
              f"{' [self-test: model vs model]' if report.get('self_test') else ''}**"]
    return "\n".join(lines)


def environment(on_gpu: bool) -> dict:
    import importlib.metadata
    import subprocess

    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "numpy": np.__version__, "host": platform.node()}
    try:
        env["cutlass_dsl"] = importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:
        env["cutlass_dsl"] = "unknown"
    if on_gpu:
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
        env["cuda"] = torch.version.cuda
    try:
        env["git_revision"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_SCRIPTS.parent, capture_output=True, text=True,
            timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        env["git_revision"] = "unknown"
    if env["git_revision"] == "unknown":  # the device copy has no .git
        env["git_revision"] = os.environ.get("DASH_GIT_REV", "unknown")
    return env


def build_sets(variants, tiles: dict[int, int], seed: int) -> dict:
    keys = sorted({(v.dtype, v.n, v.k) for v in variants})
    return {(dt, n, k): generate(dt, tiles[k], seed, (64, n, k)) for dt, n, k in keys}


def _plain_examples(got, want, cases: MMACases, load_c: bool, limit: int) -> list[dict]:
    """validate_mma's ``examples`` without the other candidates' bits (cheap)."""
    from validate_mma import mismatch_row

    return [mismatch_row(got, want, cases, load_c, t, i, j)
            for t, i, j in list(zip(*np.nonzero(got != want)))[:limit]]


def evaluate(variants, sets: dict, outputs: dict, model: dict, ptx: dict, examples_n: int,
             extra: dict, examples_budget_s: float = 60.0) -> dict:
    """The report of ``outputs`` (``{name: bits}`` or ``{name: "error text"}``) against the
    model's ``{(key, load_c): bits}``. Mismatch examples carry every candidate reading's
    bits (validate_mma's ``examples``) until ``examples_budget_s`` is spent, then only the
    GPU's and the model's."""
    from validate_mma import compare, examples

    results = []
    start = time.time()
    for v in variants:
        key = (v.dtype, v.n, v.k)
        base = {"variant": v.name, "op": v.op, "n": v.n, "k": v.k, "dtype": v.dtype,
                "load_c": v.load_c, "ptx": ptx.get(v.name)}
        got = outputs.get(v.name)
        if got is None:
            continue
        if isinstance(got, str):
            results.append({**base, "error": got})
            continue
        cases = sets[key]
        want = model[(key, v.load_c)]
        res = {**base, **compare(got, want, cases)}
        full = time.time() - start < examples_budget_s
        res["examples"] = (examples if full else _plain_examples)(got, want, cases, v.load_c,
                                                                   examples_n)
        results.append(res)
    ok = [r for r in results if "error" not in r]
    total = {"variants": len(results), "errors": len(results) - len(ok),
             "tiles": sum(r["tiles"] for r in ok), "outputs": sum(r["outputs"] for r in ok),
             "mismatches": sum(r["mismatches"] for r in ok)}
    return {
        **extra,
        "model": {**dataclasses.asdict(HOPPER), "k_step": 16, "order": "ascending"},
        "test_sets": {f"{dt}/n{n}k{k}": {"shape": list(c.shape), "tiles": len(c),
                                          "families": c.counts(), "fingerprint": c.fingerprint()}
                      for (dt, n, k), c in sets.items()},
        "results": results,
        "total": total,
        "pass": total["mismatches"] == 0 and total["errors"] == 0 and total["variants"] > 0,
    }


def write_report(report: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "validate_wgmma.json").write_text(json.dumps(report, indent=1))
    with open(out / "mismatches.txt", "w") as f:
        for r in report["results"]:
            for ex in r.get("examples", []):
                f.write(f"{r['variant']} {json.dumps(ex)}\n")
    text = tables(report)
    (out / "summary.md").write_text(text + "\n")
    return text


def _ptx_facts(manifest_rows: dict, name: str) -> dict | None:
    row = manifest_rows.get(name)
    if not row or not row.get("wgmma"):
        return None
    return {"count": len(row["wgmma"]), "opcode": row["wgmma"][0]["opcode"],
            "a_form": row["wgmma"][0]["a_form"], "ok": row["ptx_ok"],
            "failures": row["ptx_failures"]}


# ---------------------------------------------------------------------------------------
# self-test (no GPU): the comparison plumbing
# ---------------------------------------------------------------------------------------
def self_test(out: Path, jobs: int) -> int:
    """The model's outputs as "hardware" give 0 mismatches; one flipped bit gives exactly 1,
    reported at its place; an output never written (all ones) counts as a mismatch."""
    variants = [v for v in _kernels().all_variants()
                if (v.n, v.k) in ((64, 16), (128, 64)) and v.op in ("ss_kk", "rs_mn")]
    sets = build_sets(variants, {16: 16, 64: 4, 128: 2}, seed=0)
    _STATE["cases"] = sets
    needed = sorted({((v.dtype, v.n, v.k), v.load_c) for v in variants})
    tasks = model_tasks(sets, needed, chunk_products=1 << 20)
    if jobs > 1:
        with _pool(jobs) as pool:
            model = assemble(pool.map(_model_task, tasks), sets)
    else:
        model = assemble(map(_model_task, tasks), sets)
    # "hardware": straight mma_bits calls, not the chunked pool path
    outputs = {}
    for v in variants:
        cases = sets[(v.dtype, v.n, v.k)]
        outputs[v.name] = mma_bits(cases.a_bits, cases.b_bits,
                                   cases.c_bits if v.load_c else None, v.dtype)
    failures = []
    clean = evaluate(variants, sets, outputs, model, {}, 5, {"self_test": True})
    if clean["total"]["mismatches"] != 0 or not clean["pass"]:
        failures.append(f"model vs itself: {clean['total']['mismatches']} mismatches")
    flip = variants[1]
    t, i, j = 1, 5, 7
    outputs[flip.name] = outputs[flip.name].copy()
    outputs[flip.name][t, i, j] ^= np.uint32(1)
    flipped = evaluate(variants, sets, outputs, model, {}, 5, {"self_test": True})
    per = {r["variant"]: r["mismatches"] for r in flipped["results"]}
    ex = next(r for r in flipped["results"] if r["variant"] == flip.name)["examples"]
    if flipped["total"]["mismatches"] != 1 or per[flip.name] != 1 or flipped["pass"]:
        failures.append(f"one flipped bit: {flipped['total']['mismatches']} mismatches")
    if not ex or (ex[0]["tile"], ex[0]["row"], ex[0]["col"]) != (t, i, j):
        failures.append(f"the flipped bit reported at {ex[:1]}")
    unwritten = variants[2]
    outputs[unwritten.name] = np.full_like(outputs[unwritten.name], 0xFFFFFFFF)
    third = evaluate(variants, sets, outputs, model, {}, 5, {"self_test": True})
    r3 = next(r for r in third["results"] if r["variant"] == unwritten.name)
    if r3["mismatches"] != r3["outputs"]:
        failures.append(f"unwritten outputs: {r3['mismatches']} of {r3['outputs']} counted")
    cheap = evaluate(variants, sets, outputs, model, {}, 5, {"self_test": True},
                     examples_budget_s=0.0)
    ex = next(r for r in cheap["results"] if r["variant"] == flip.name)["examples"]
    if len(ex) != 1 or "candidates" in ex[0] or ex[0]["gpu"] == ex[0]["model"]:
        failures.append(f"examples past their time budget: {ex}")
    flipped["self_test_failures"] = failures
    text = write_report(flipped, out)
    print(text)
    print(f"\nself-test: model vs itself {clean['total']['mismatches']} mismatches, one "
          f"flipped bit {flipped['total']['mismatches']}, unwritten tile "
          f"{r3['mismatches']}/{r3['outputs']}: {'PASS' if not failures else 'FAIL'}")
    for f in failures:
        print("   ", f)
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for the JSON, tables and logs")
    ap.add_argument("--export", metavar="DIR", default=None,
                    help="compile and export every variant to DIR (CPU, no GPU), check PTX")
    ap.add_argument("--aot", metavar="DIR", default=None,
                    help="load the variants exported to DIR instead of compiling them")
    ap.add_argument("--self-test", action="store_true",
                    help="check the comparison plumbing on the CPU (no GPU, no compile)")
    ap.add_argument("--only", default=None,
                    help="comma-separated substrings; run the variants whose name has one")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--tiles16", type=int, default=DEFAULT_TILES[16])
    ap.add_argument("--tiles64", type=int, default=DEFAULT_TILES[64])
    ap.add_argument("--tiles96", type=int, default=DEFAULT_TILES[96])
    ap.add_argument("--tiles128", type=int, default=DEFAULT_TILES[128])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=20, help="mismatches kept per variant")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="CPU processes for the model / the export (default: all cores)")
    args = ap.parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]

    if args.self_test:
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wgmma_selftest_"))
        return self_test(out, min(args.jobs, 2))
    variants = select_variants(args.only, dtypes)
    if not variants:
        ap.error("no variant selected")
    if args.export:
        return export_all(variants, args.export, max(1, args.jobs))
    if not args.out:
        ap.error("--out is required for a GPU run")

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: run with --export DIR or --self-test on a CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    t0 = time.time()
    tiles = {16: args.tiles16, 64: args.tiles64, 96: args.tiles96, 128: args.tiles128}
    sets = build_sets(variants, tiles, args.seed)
    _STATE["cases"] = sets
    print(f"{len(sets)} test sets built in {time.time() - t0:.1f} s", flush=True)

    # model workers forked before CUDA is initialised; they run while the GPU works
    needed = sorted({((v.dtype, v.n, v.k), v.load_c) for v in variants})
    pool = _pool(max(1, args.jobs))
    model_async = pool.map_async(_model_task, model_tasks(sets, needed))

    manifest_rows, manifest = {}, {}
    if args.aot and Path(args.aot, MANIFEST).exists():
        manifest = json.loads(Path(args.aot, MANIFEST).read_text())
        manifest_rows = {r["name"]: r for r in manifest["variants"]}
    outputs: dict = {}
    how: dict = {}
    t1 = time.time()
    for v in variants:
        try:
            kernel, how[v.name] = load_kernel(v, args.aot, str(out / "ptx" / v.name))
            outputs[v.name] = run_variant(kernel, sets[(v.dtype, v.n, v.k)], torch)
        except Exception as e:  # noqa: BLE001 - report and go on with the other variants
            outputs[v.name] = f"{type(e).__name__}: {str(e)[:500]}"
            print(f"{v.name}: FAILED {outputs[v.name]}", flush=True)
    ptx = {}
    for v in variants:
        if how.get(v.name) == "compiled":
            files = sorted((out / "ptx" / v.name).glob("*.ptx"))
            if files:
                text = files[0].read_text()
                manifest_rows[v.name] = {"wgmma": wgmma_instructions(text),
                                         "ptx_failures": check_ptx(text, v)}
                manifest_rows[v.name]["ptx_ok"] = not manifest_rows[v.name]["ptx_failures"]
        ptx[v.name] = _ptx_facts(manifest_rows, v.name)
    loaded = sum(1 for h in how.values() if h == "aot")
    print(f"ran {len(variants)} variants on the GPU in {time.time() - t1:.1f} s "
          f"({loaded} loaded from {args.aot}, {len(how) - loaded} compiled)", flush=True)

    t1 = time.time()
    model = assemble(model_async.get(), sets)
    pool.close()
    pool.join()
    print(f"model in {time.time() - t1:.1f} s more", flush=True)

    report = evaluate(variants, sets, outputs, model, ptx, args.examples, {
        "command": " ".join([sys.executable, *sys.argv]),
        "environment": environment(True),
        "seed": args.seed,
        "kernels": {k: how.get(k) for k in outputs},
        "aot": args.aot,
        "aot_exported_with": {"cutlass_dsl": manifest.get("cutlass_dsl"),
                              "register_a_check": manifest.get("register_a_check")},
    })
    report["seconds"] = round(time.time() - t0, 1)
    text = write_report(report, out)
    print()
    print(text)
    print(f"\nfull report: {out / 'validate_wgmma.json'}  ({report['seconds']} s)")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
