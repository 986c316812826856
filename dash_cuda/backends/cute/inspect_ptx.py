"""Compile every CuTe kernel variant for sm_90a (no GPU needed) and check its PTX.

    python -m dash_cuda.backends.cute.inspect_ptx [--out DIR] [--export DIR] [--quick]

For each variant (the forwards: d in {64, 128}, bf16/fp16, causal; the backwards: also
deterministic, audit, plus the GQA per-head epilogue) this compiles the kernel, keeps its
PTX, checks the instruction facts of :mod:`.contract` (:func:`check_ptx`), reports
registers and spills (``ptxas -v``, when a ptxas is on PATH) and the compile time, and checks
that the staged dQ tile order (:func:`~.bwd_kernel.staging_coords`) is the MMA's own
partition. ``--export`` also writes every variant as an ahead-of-time object
(``DASH_CUTE_AOT_DIR`` loads them). Exit status 1
if any check fails.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before CuTe DSL reads its settings

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from . import launch  # noqa: E402
from .bwd_kernel import RED_UNROLL, TILES, DashBackwardSm90, staging_coords  # noqa: E402
from .fwd_kernel import FORWARD_TILES, forward_block_ms  # noqa: E402


def all_variants(quick: bool = False) -> list[launch.Variant | launch.ForwardVariant]:
    dims = (64,) if quick else (64, 128)
    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16)
    out: list = [launch.ForwardVariant(dt, d, causal, block_m)
                 for d, dt, causal in itertools.product(dims, dtypes, (False, True))
                 for block_m in forward_block_ms(d, causal)]
    for d, dt, causal, det, audit in itertools.product(dims, dtypes, (False, True),
                                                       (True, False), (False, True)):
        out.append(launch.Variant(dt, d, causal, det, audit, per_head=audit))
    # GQA runs the per-head epilogue without audit
    for d, causal, det in itertools.product(dims, (False, True), (True, False)):
        out.append(launch.Variant(torch.bfloat16, d, causal, det, False, per_head=True))
    return out


def expected_wgmmas(d: int) -> int:
    """wgmma instructions per visit and warpgroup: k-blocks of S, dP, dV, dK and the partial."""
    bm, bn = TILES[d].block_m, TILES[d].block_n
    return 2 * (d // 16) + 2 * (bm // 16) + bn // 16


def check_forward_ptx(ptx: str, v: launch.ForwardVariant) -> list[str]:
    """The forward contract's instruction facts; returns the failures."""
    cfg = FORWARD_TILES[v.head_dim, v.block_m]
    d, bm, bn = v.head_dim, cfg.block_m, cfg.block_n
    threads = cfg.math_threads
    scores = bm * bn // threads  # per math thread
    bad = []

    def need(cond, msg):
        if not cond:
            bad.append(msg)

    def count(pattern):
        return len(re.findall(pattern, ptx))

    need(".target sm_90a" in ptx, "target is not sm_90a")
    # a KV tile's steps are written out three times: for the first KV tile, and in the loops
    # over the unmasked and the masked others (where S_j overlaps P_{j-1} V_{j-1})
    copies = 3
    # [fwd_probs]: P = ex2 of one fma.rn.f32 of the raw score (the scale not rounded on its
    # own), alpha = ex2 of one sub.rn.f32; nothing else reaches an ex2
    probs = re.findall(r"fma\.rn\.f32\s+(\w+),[^;]*;\s*ex2\.approx\.ftz\.f32\s+[^,]+,\s*(\w+);",
                       ptx)
    alphas = count(r"sub\.rn\.f32 \S+, \S+, \S+;\s*ex2\.approx\.ftz\.f32")
    need(len(probs) == copies * scores and all(x == y for x, y in probs),
         f"{len(probs)} fma.rn.f32 -> ex2 pairs, expected {copies * scores}")
    need(alphas == copies * 2, f"{alphas} sub.rn.f32 -> ex2 pairs, expected {copies * 2}")
    need(count(r"\bex2\.") == copies * (scores + 2),
         f"{count(r'ex2[.]')} ex2, expected {copies * (scores + 2)}")
    # [fwd_max]: the scale multiplies each row's largest raw score once (two rows a thread)
    need(count(r"\bmul\.rn\.f32") == copies * 2,
         f"{count(r'mul[.]rn[.]f32')} mul.rn.f32, expected {copies * 2}")
    # [fwd_max]: two butterfly steps per row; [fwd_finish]: two more per row for l
    shfl = count(r"shfl\.sync\.bfly\.b32")
    need(shfl == copies * 4 + 4, f"{shfl} shfl.sync.bfly, expected {copies * 4 + 4}")
    # [fwd_accumulate]: one fma.rn.f32 per row per KV tile (l * alpha + sum), besides P's
    need(count(r"\bfma\.rn\.f32") == copies * (scores + 2),
         f"{count(r'fma[.]rn[.]f32')} fma.rn.f32, expected {copies * (scores + 2)}")
    # [fwd_finish]: one rcp.rn per row (no division per element), lg2
    need(count(r"\brcp\.rn\.f32") == 2 and count(r"\bdiv\.[\w.]*f32") == 0,
         "expected 2 rcp.rn.f32 and no f32 division")
    need(count(r"lg2\.approx\.ftz\.f32") == 2, "expected 2 lg2.approx.ftz.f32")
    # S = Q K^T: d / 16 k-steps, issued in the first tile and both loops; P V: bn / 16,
    # issued in both loops and after them
    mma = count(r"wgmma\.mma_async")
    want = copies * (d // 16 + bn // 16)
    need(mma == want, f"{mma} wgmma, expected {want}")
    n_load = count(r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global")
    n_store = count(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta")
    need(n_load == 3 * (d // 64), f"{n_load} TMA loads, expected {3 * (d // 64)}")
    need(n_store == d // 64, f"{n_store} TMA stores, expected {d // 64}")
    return bad


def check_ptx(ptx: str, v: launch.Variant | launch.ForwardVariant) -> list[str]:
    """The contract's instruction facts; returns the failures."""
    if isinstance(v, launch.ForwardVariant):
        return check_forward_ptx(ptx, v)
    bad = []
    d, bm, bn = v.head_dim, TILES[v.head_dim].block_m, TILES[v.head_dim].block_n
    scores = bn * bm // 256  # score elements per math thread

    def need(cond, msg):
        if not cond:
            bad.append(msg)

    need(".target sm_90a" in ptx, "target is not sm_90a")
    # [softmax_p]: every ex2 is ex2.approx.ftz.f32 fed by one fma.rn.f32 of the same block
    ex2_all = len(re.findall(r"\bex2\.", ptx))
    pairs = re.findall(r"fma\.rn\.f32\s+(\w+),[^;]*;\s*ex2\.approx\.ftz\.f32\s+[^,]+,\s*(\w+);",
                       ptx)
    need(ex2_all == scores, f"{ex2_all} ex2 instructions, expected {scores}")
    need(len(pairs) == scores and all(a == b for a, b in pairs),
         f"{len(pairs)} fma.rn.f32 -> ex2.approx.ftz.f32 pairs, expected {scores}")
    # [softmax_p]'s mask: a select of the value or 0 per score element (ptxas may copy it
    # into several paths)
    n_selp = len(re.findall(r"\bselp\.(?:b32|f32)\s+%\w+,\s*%\w+,\s*0(?:f0+)?,\s*%p\w+;", ptx))
    need(n_selp >= scores, f"{n_selp} mask selects (selp x, 0), expected at least {scores}")
    # [ds]: sub then mul, both rounded (no contraction into an fma)
    ds = re.findall(r"sub\.rn\.f32\s+(\w+),[^;]*;\s*mul\.rn\.f32\s+[^,]+,\s*[^,]+,\s*(\w+);", ptx)
    need(len(ds) == scores and all(a == b for a, b in ds),
         f"{len(ds)} sub.rn.f32 -> mul.rn.f32 pairs, expected {scores}")
    # [qk], [dp], [dv_step], [dk_step], [dq_partial]
    n_wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    need(n_wgmma == expected_wgmmas(d), f"{n_wgmma} wgmma.mma_async, expected "
         f"{expected_wgmmas(d)}")
    # rnd(P), rnd(dS) to the operand dtype
    cvt = "cvt.rn.bf16x2.f32" if v.dtype == torch.bfloat16 else "cvt.rn.f16x2.f32"
    need(len(re.findall(re.escape(cvt), ptx)) >= scores, f"fewer than {scores} {cvt}")
    # [dq_add]
    if v.dq_add == "red":
        bad += check_red_writer(ptx, v)
    else:
        bad += check_bulk_writer(ptx, v)
    need("setmaxnreg.dec.sync.aligned.u32 \t24" in ptx or
         re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx) is not None,
         "no setmaxnreg.dec 24")
    need(re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx) is not None,
         "no setmaxnreg.inc 240")
    # loads of Q, dO, K, V: one box per 64 columns (a 128-byte swizzle row)
    n_load = len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global", ptx))
    need(n_load == 4 * (d // 64), f"{n_load} TMA tensor loads, expected {4 * (d // 64)}")
    n_store = len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta", ptx))
    # (dK and dV; a box per 128-byte swizzle row: 64 bf16 columns or 32 fp32 ones per head)
    stores = 2 * (d // 32) if v.per_head else 2 * (d // 64)
    need(n_store == stores, f"{n_store} TMA tensor stores, expected {stores}")
    return bad


def check_bulk_writer(ptx: str, v: launch.Variant) -> list[str]:
    """[dq_add] by the TMA unit: one bulk reduce-add per staged tile; deterministic: the
    acquire spin before it, the wait for its completion and a proxy fence before the
    release."""
    bad = []

    def need(cond, msg):
        if not cond:
            bad.append(msg)

    red = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"
    need(ptx.count(red) == 1, f"{red} appears {ptx.count(red)} times, expected once")
    audit_copy = "cp.async.bulk.global.shared::cta.bulk_group "
    need((audit_copy in ptx) == v.audit, "audit bulk copy presence != audit")
    if v.deterministic:
        need("ld.acquire.gpu" in ptx, "no ld.acquire.gpu spin")
        tail = ptx[ptx.index(red):] if red in ptx else ""
        m_wait = re.search(r"cp\.async\.bulk\.wait_group(\.read)?\s+0;", tail)
        m_rel = re.search(r"st\.release\.gpu", tail)
        need(m_wait is not None and m_wait.group(1) is None,
             "first bulk wait after the add is not 'cp.async.bulk.wait_group 0'")
        need(m_rel is not None and m_wait is not None and m_wait.start() < m_rel.start(),
             "release store does not follow the completed-wait")
        if m_wait is not None and m_rel is not None:
            need("fence.proxy.async.global" in tail[m_wait.start():m_rel.start()],
                 "no proxy fence between the completed bulk add and the release")
    else:
        need("ld.acquire" not in ptx and "st.release" not in ptx,
             "atomic variant has semaphore code")
        need(re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx) is not None,
             "atomic variant: no wait_group.read before freeing the staging buffer")
    return bad


def check_red_writer(ptx: str, v: launch.Variant) -> list[str]:
    """[dq_add], the diagnostic ``dq_add="red"`` writer: vector ``red.global.add.v4.f32``
    (``RED_UNROLL`` of them in the unrolled loop), no bulk reduce-add; deterministic: the
    acquire spin, a warp barrier, the adds, a warp barrier, then the release store."""
    bad = []

    def need(cond, msg):
        if not cond:
            bad.append(msg)

    red = "red.global.add.v4.f32"
    need(ptx.count(red) == RED_UNROLL, f"{red} appears {ptx.count(red)} times, expected "
         f"{RED_UNROLL}")
    need("cp.reduce.async.bulk" not in ptx, "a bulk reduce-add in the red.add writer")
    if v.deterministic and red in ptx:
        head, tail = ptx[:ptx.index(red)], ptx[ptx.rindex(red):]
        acquire = head.rfind("ld.acquire.gpu")
        need(acquire >= 0 and "bar.warp.sync" in head[acquire:],
             "no acquire spin and warp barrier before the adds")
        m_rel = re.search(r"st\.release\.gpu", tail)
        need(m_rel is not None and "bar.warp.sync" in tail[:m_rel.start()],
             "no warp barrier, then release store, after the adds")
    elif not v.deterministic:
        need("ld.acquire" not in ptx and "st.release" not in ptx,
             "atomic variant has semaphore code")
    return bad


def compile_ptx(v: launch.Variant, folder: str) -> tuple[object, str, str, float]:
    """Compile ``v`` keeping its PTX under ``folder``: (kernel, PTX text, PTX path, seconds).

    The kernel also enters the in-memory cache, so an ``--export`` after it does not compile
    again.
    """
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    start = time.time()
    kernel = launch.compile_kernel(v, f"--keep-ptx --dump-dir={folder}")
    seconds = time.time() - start
    launch._cache[v] = kernel
    ptx_files = sorted(f for f in os.listdir(folder) if f.endswith(".ptx"))
    if not ptx_files:
        raise RuntimeError(f"{v.name}: no PTX was kept in {folder}")
    path = os.path.join(folder, ptx_files[0])
    with open(path) as f:
        return kernel, f.read(), path, seconds


def check_launch_registers(report: str, v: launch.Variant | launch.ForwardVariant) -> list[str]:
    """The backward's residency (``launch.ctas_per_sm``) assumes ``REGISTERS_AT_LAUNCH``
    registers per thread: ptxas must agree (nothing to check where ptxas did not run)."""
    m = re.match(r"regs=(\d+)", report)
    if m is None or not isinstance(v, launch.Variant):
        return []
    regs = int(m.group(1))
    if regs != launch.REGISTERS_AT_LAUNCH:
        return [f"ptxas gives {regs} registers per thread, launch.REGISTERS_AT_LAUNCH says "
                f"{launch.REGISTERS_AT_LAUNCH}"]
    return []


def ptxas_report(ptx_path: str) -> str:
    """Registers, spills and wgmma serialization warnings from ``ptxas -v``: the first ptxas
    on PATH that accepts the PTX's version (an older one, such as Triton's, refuses it)."""
    candidates = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        exe = os.path.join(folder, "ptxas")
        if os.access(exe, os.X_OK) and exe not in candidates:
            candidates.append(exe)
    if not candidates:
        return "ptxas not found"
    text = ""
    for exe in candidates:
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([exe, "-arch=sm_90a", "-v", ptx_path, "-o",
                                os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
        text = r.stdout + r.stderr
        if r.returncode == 0:
            break
    else:
        return "no ptxas on PATH accepts this PTX: " + text.strip().splitlines()[-1][:80]
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    serial = "C7512" in text or "serialized" in text
    return (f"regs={regs.group(1) if regs else '?'} "
            f"spill_st={spill.group(1) if spill else '?'} "
            f"spill_ld={spill.group(2) if spill else '?'}"
            + (" WGMMA-SERIALIZED" if serial else ""))


def check_staging_layout() -> list[str]:
    """``staging_coords`` (the dQacc tile order) equals the MMA's own partition of the tile."""
    found: dict = {}

    @cute.jit
    def probe(k: cutlass.Constexpr):
        _, _, mma_dq = k._tiled_mmas()
        ident = cute.make_identity_tensor((k.bm, k.d))
        for t in list(range(256)):  # a Python loop at trace time
            part = mma_dq.get_slice(t).partition_C(ident)
            found[t] = [part[e] for e in range(cute.size(part))]

    bad = []
    for d in TILES:
        found.clear()
        k = DashBackwardSm90(cutlass.BFloat16, d, causal=False, deterministic=True,
                             audit=False, per_head=False)
        cute.compile(probe, k, options="--gpu-arch=sm_90a")
        coords = staging_coords(d)
        half = k.bm * d // 2
        for t, regs in found.items():
            w, tl = divmod(t, 128)
            for r, rc in enumerate(regs):
                pos = w * half + (r // 4) * 512 + 4 * tl + r % 4
                if tuple(int(x) for x in rc) != coords[pos]:
                    bad.append(f"d={d}: thread {t} register {r} is {rc}, staging says "
                               f"{coords[pos]}")
                    break
        if sorted(coords) != [(r, c) for r in range(k.bm) for c in range(d)]:
            bad.append(f"d={d}: staging order is not a permutation of the tile")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "dash_cute_ptx"))
    ap.add_argument("--export", default=None, help="write AOT objects to this directory")
    ap.add_argument("--quick", action="store_true", help="d=64 bf16 only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    failures = 0

    bad = check_staging_layout()
    print(f"staging layout vs partition_C: {'OK' if not bad else 'FAIL'}")
    for b in bad[:5]:
        print("   ", b)
    failures += bool(bad)

    rows = []
    for v in all_variants(args.quick):
        try:
            kernel, ptx, ptx_path, seconds = compile_ptx(v, os.path.join(args.out, v.name))
        except Exception as e:  # noqa: BLE001 - report and go on with the other variants
            print(f"{v.name}: COMPILE FAILED: {type(e).__name__}: {str(e)[:500]}")
            failures += 1
            continue
        bad = check_ptx(ptx, v)
        report = ptxas_report(ptx_path)
        bad += check_launch_registers(report, v)
        failures += bool(bad)
        rows.append((v.name, seconds, "OK" if not bad else "FAIL", report))
        print(f"{v.name:48s} {seconds:5.1f}s  {'OK  ' if not bad else 'FAIL'}  {rows[-1][3]}",
              flush=True)
        for b in bad:
            print("    -", b)
    if args.export:
        t0 = time.time()
        names = launch.export_kernels(all_variants(args.quick), args.export)
        print(f"exported {len(names)} AOT objects to {args.export} in {time.time() - t0:.1f}s")
    times = [r[1] for r in rows]
    if times:
        print(f"compile time per variant: min {min(times):.1f}s  median "
              f"{sorted(times)[len(times) // 2]:.1f}s  max {max(times):.1f}s  "
              f"({len(times)} variants)")
    print("ALL CHECKS PASSED" if failures == 0 else f"{failures} FAILURE(S)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
