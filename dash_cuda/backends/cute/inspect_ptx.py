"""Compile every CuTe kernel variant for sm_90a (no GPU needed) and check its PTX.

    python -m dash_cuda.backends.cute.inspect_ptx [--out DIR] [--export DIR] [--quick]
        [--head-dims D ...]

For each shipped variant (:func:`.variants.shipped_variants`, the list warm-up exports and
the tests use) this compiles the kernel, keeps its
PTX, checks the instruction facts of :mod:`.contract` (:func:`check_ptx`) and that the only
approximate instructions are the ones :mod:`dash_ref.arithmetic.mufu` models bit for bit
(:func:`check_approx_ptx`), assembles the PTX with Triton's bundled ``ptxas`` and checks
that each of those is one bare ``MUFU`` instruction in the SASS (:func:`check_mufu_sass`;
skipped, with the reason, where no ptxas and disassembler are found), reports registers and
spills (``ptxas -v``, when a ptxas is on PATH) and the compile time, and checks that the
staged dQ tile order (:func:`~.bwd_kernel.staging_coords`) is the MMA's own partition.
``--export`` also writes every variant as an ahead-of-time object (``DASH_CUTE_AOT_DIR``
loads them). Exit status 1 if any check fails.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # before CuTe DSL reads its settings

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from . import launch  # noqa: E402
from .bwd_kernel import staging_coords  # noqa: E402
from .config import HEAD_DIMS  # noqa: E402
from .layouts import atom_columns  # noqa: E402
from .variants import ForwardVariant, Variant, backward_variant, shipped_variants  # noqa: E402


def all_variants(quick: bool = False, head_dims: tuple[int, ...] | None = None
                 ) -> list[Variant | ForwardVariant]:
    """:func:`.variants.shipped_variants` (``quick``: bf16 at d = 64 only; ``head_dims``:
    those head dims only)."""
    if quick:
        return shipped_variants((torch.bfloat16,), (64,))
    return shipped_variants(head_dims=head_dims or HEAD_DIMS)


def math_traces(v: Variant) -> int:
    """Copies of the math warpgroups' visit loop in the kernel: two where each warpgroup role
    has its own (``math_per_role``), else one."""
    return 2 if v.config.math_per_role else 1


def expected_wgmmas(v: Variant) -> int:
    """wgmma instructions in the kernel: k-blocks of S, dP, dV and dK in every trace of the
    visit loop, and of the partial once (in the one trace that holds it, or the one trace)."""
    d, bm, bn = v.head_dim, v.config.block_m, v.config.block_n
    return math_traces(v) * (d // 16 + (v.head_dim_v or d) // 16 + 2 * (bm // 16)) + bn // 16


def check_forward_ptx(ptx: str, v: ForwardVariant) -> list[str]:
    """The forward contract's instruction facts; returns the failures."""
    cfg = v.config
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
    # over the unmasked and the masked others (where S_j overlaps P_{j-1} V_{j-1}); a
    # window's four times (its masked tiles before and after the unmasked ones)
    masked_loops = 2 if v.mask == "window" else 1
    copies = 2 + masked_loops
    # [fwd_probs]: P = ex2 of one fma.rn.f32 of the raw score (the scale not rounded on its
    # own), alpha = ex2 of one sub.rn.f32; nothing else reaches an ex2
    probs = re.findall(r"fma\.rn\.f32\s+(\w+),[^;]*;\s*ex2\.approx\.ftz\.f32\s+[^,]+,\s*(\w+);",
                       ptx)
    alphas = count(r"sub\.rn\.f32 \S+, \S+, \S+;\s*ex2\.approx\.ftz\.f32")
    # [fwd_sink], once per row after the last KV tile: alpha and the sink's probability,
    # each ex2 of one sub.rn.f32; l by one fma.rn.f32; the row's sum by two butterflies
    sinks = 2 if getattr(v, "sinks", False) else 0
    # [softcap] (softcap variants), per score of every copy: mul.rn.f32, ex2, add.rn.f32,
    # lg2, ex2 (the ratio), fma.rn.f32 (the capped score)
    capped = copies * scores if getattr(v, "softcap", False) else 0
    need(len(probs) == copies * scores and all(x == y for x, y in probs),
         f"{len(probs)} fma.rn.f32 -> ex2 pairs, expected {copies * scores}")
    need(alphas == copies * 2 + 2 * sinks,
         f"{alphas} sub.rn.f32 -> ex2 pairs, expected {copies * 2 + 2 * sinks}")
    want = copies * (scores + 2) + 2 * sinks + 2 * capped
    need(count(r"\bex2\.") == want, f"{count(r'ex2[.]')} ex2, expected {want}")
    # [fwd_max]: the scale multiplies each row's largest raw score once (two rows a thread)
    want = copies * 2 + capped
    need(count(r"\bmul\.rn\.f32") == want,
         f"{count(r'mul[.]rn[.]f32')} mul.rn.f32, expected {want}")
    # [fwd_max]: two butterfly steps per row; [fwd_finish]: two more per row for l
    shfl = count(r"shfl\.sync\.bfly\.b32")
    want = copies * 4 + 4 + 2 * sinks
    need(shfl == want, f"{shfl} shfl.sync.bfly, expected {want}")
    # [fwd_accumulate]: one fma.rn.f32 per row per KV tile (l * alpha + sum), besides P's
    want = copies * (scores + 2) + sinks + capped
    need(count(r"\bfma\.rn\.f32") == want,
         f"{count(r'fma[.]rn[.]f32')} fma.rn.f32, expected {want}")
    # [fwd_finish]: one rcp.rn per row (no division per element), lg2 (and [softcap]'s)
    need(count(r"\brcp\.rn\.f32") == 2 and count(r"\bdiv\.[\w.]*f32") == 0,
         "expected 2 rcp.rn.f32 and no f32 division")
    need(count(r"lg2\.approx\.ftz\.f32") == 2 + capped,
         f"expected {2 + capped} lg2.approx.ftz.f32")
    # S = Q K^T: d / 16 k-steps, issued in the first tile and both loops; P V: bn / 16,
    # issued in both loops and after them
    mma = count(r"wgmma\.mma_async")
    want = copies * (d // 16 + bn // 16)
    need(mma == want, f"{mma} wgmma, expected {want}")
    n_load = count(r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global")
    n_store = count(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta")
    # per tile of Q and K (d columns), V and O (d_v): one box per swizzle atom
    dv = v.head_dim_v or d
    boxes, boxes_v = d // atom_columns(d, 2), dv // atom_columns(dv, 2)
    need(n_load == 2 * boxes + boxes_v, f"{n_load} TMA loads, expected {2 * boxes + boxes_v}")
    # packed: a warpgroup's rows that lie inside the sequence leave by the TMA store, and
    # those of a sequence's last, partial rows from registers by stores predicated on the
    # sequence's end (a TMA store would write the next sequence's rows), d / 2 per thread
    # (two rows, bf16 / fp16 each); LSE2 by two row stores on each path; each of the
    # loader and the math warps reads cu_seqlens_q[b], [b + 1], cu_seqlens_k[b], [b + 1]
    packed = getattr(v, "packed", False)
    need(n_store == boxes_v, f"{n_store} TMA stores, expected {boxes_v}")
    # the tile counter (the loader's, dynamic launches): one atomic add per ticket, and the
    # 0 that the launch's last ticket stores back, at the atomic's address
    tickets = re.findall(r"atom\.global\.add\.u32\s+%r\d+, \[(%rd\d+)\], 1;", ptx)
    resets = re.findall(r"st\.global\.b32\s+\[(%rd\d+)\], 0;", ptx)
    need(len(tickets) == 1 and resets == tickets,
         f"{len(tickets)} tile-counter atomics and {len(resets)} stores of 0, expected one "
         "of each at one address")
    if packed:
        o_stores = count(r"st\.global\.b16")
        lse_stores = count(r"st\.global\.b32") - len(resets)
        need(o_stores == dv // 2, f"{o_stores} st.global.b16 (O), expected {dv // 2}")
        need(lse_stores == 4, f"{lse_stores} st.global.b32 (LSE2), expected 4")
        offsets = count(r"ld\.global\.b32") - (sinks > 0)
        need(offsets == 8, f"{offsets} ld.global.b32 (cu_seqlens), expected 8")
    else:  # O by the TMA store alone; no offsets
        need(count(r"st\.global\.b16") == 0, "st.global.b16 in a rectangular forward")
        loads = count(r"ld\.global\.b32")
        need(loads == (sinks > 0), f"{loads} ld.global.b32, expected {int(sinks > 0)} (the "
             "sink)")
    bad += check_forward_mask(ptx, v)
    return bad


#: the bounds a forward's mask compares each score against (:mod:`.mask`): ``S_k``, and the
#: diagonal (causal) or both sides of the window
MASK_BOUNDS = {"full": 1, "causal": 2, "window": 3}


def check_forward_mask(ptx: str, v: ForwardVariant) -> list[str]:
    """[fwd_scores]'s mask: each bound of :data:`MASK_BOUNDS` is one ``selp x, -inf`` per
    score, in the first KV tile (behind its run-time test) and in each masked loop: a
    full mask has no diagonal select, a window one select more than causal's (its left
    side). ptxas may copy a few into several paths, never a whole bound's worth."""
    cfg = v.config
    scores = cfg.block_m * cfg.block_n // cfg.math_threads
    tiles = 1 + (2 if v.mask == "window" else 1)  # the first tile, the masked loops
    minus_inf = r"(?:0fFF800000|-8388608)"  # the float's bits, or the same as an integer
    n = len(re.findall(rf"\bselp\.(?:f32|b32)\s+%\w+,\s*(?:%\w+,\s*{minus_inf}|{minus_inf},"
                       rf"\s*%\w+),\s*%p\w+;", ptx))
    want = MASK_BOUNDS[v.mask]
    if n // (tiles * scores) != want:
        return [f"{n} mask selects (selp x, -inf) in {tiles} masked copies of {scores} "
                f"scores: {n // (tiles * scores)} per score, expected {want} ({v.mask})"]
    return []


def check_ptx(ptx: str, v: Variant | ForwardVariant) -> list[str]:
    """The contract's instruction facts; returns the failures."""
    if isinstance(v, ForwardVariant):
        return check_forward_ptx(ptx, v)
    bad = []
    d, bm, bn = v.head_dim, v.config.block_m, v.config.block_n
    scores = bn * bm // 256  # score elements per math thread
    traces = math_traces(v)  # each trace of the visit loop holds its own copy of each step

    def need(cond, msg):
        if not cond:
            bad.append(msg)

    need(".target sm_90a" in ptx, "target is not sm_90a")
    # [softmax_p]: every ex2 is ex2.approx.ftz.f32 fed by one fma.rn.f32 of the same block;
    # a softcap variant's is written out twice (the masked and the unmasked tile, once
    # where every tile selects), each score's [softcap] adding two ex2 and one lg2
    cap = getattr(v, "softcap", False)
    copies = traces * ((1 if v.config.select_every_tile else 2) if cap else 1)
    ex2_all = len(re.findall(r"\bex2\.", ptx))
    pairs = re.findall(r"fma\.rn\.f32\s+(\w+),[^;]*;\s*ex2\.approx\.ftz\.f32\s+[^,]+,\s*(\w+);",
                       ptx)
    want = copies * scores * (3 if cap else 1)
    need(ex2_all == want, f"{ex2_all} ex2 instructions, expected {want}")
    need(len(pairs) == copies * scores and all(a == b for a, b in pairs),
         f"{len(pairs)} fma.rn.f32 -> ex2.approx.ftz.f32 pairs, expected {copies * scores}")
    n_lg2 = len(re.findall(r"\blg2\.approx\.ftz\.f32", ptx))
    need(n_lg2 == (copies * scores if cap else 0),
         f"{n_lg2} lg2.approx.ftz.f32, expected {copies * scores if cap else 0}")
    # [softmax_p]'s mask: a select of the value or 0 per score element and bound: S_k, S_q
    # and the diagonal (causal) or both sides of the window (the compiler folds the odd one
    # whose comparison it can decide; a whole bound's worth more or less is a fault)
    n_selp = len(re.findall(r"\bselp\.(?:b32|f32)\s+%\w+,\s*%\w+,\s*0(?:f0+)?,\s*%p\w+;", ptx))
    bounds = 1 + MASK_BOUNDS[v.mask]
    need(round(n_selp / (traces * scores)) == bounds,
         f"{n_selp} mask selects (selp x, 0), expected about {bounds * traces * scores} "
         f"({bounds} bounds of {scores} scores in {traces} traces, {v.mask})")
    # [ds]: sub then mul, both rounded (no contraction into an fma)
    ds = re.findall(r"sub\.rn\.f32\s+(\w+),[^;]*;\s*mul\.rn\.f32\s+[^,]+,\s*[^,]+,\s*(\w+);", ptx)
    need(len(ds) == traces * scores and all(a == b for a, b in ds),
         f"{len(ds)} sub.rn.f32 -> mul.rn.f32 pairs, expected {traces * scores}")
    # [qk], [dp], [dv_step], [dk_step], [dq_partial]
    n_wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    need(n_wgmma == expected_wgmmas(v), f"{n_wgmma} wgmma.mma_async, expected "
         f"{expected_wgmmas(v)}")
    # rnd(P), rnd(dS) to the operand dtype
    cvt = "cvt.rn.bf16x2.f32" if v.dtype == torch.bfloat16 else "cvt.rn.f16x2.f32"
    need(len(re.findall(re.escape(cvt), ptx)) >= traces * scores,
         f"fewer than {traces * scores} {cvt}")
    # [dq_add]
    bad += check_bulk_writer(ptx, v)
    need("setmaxnreg.dec.sync.aligned.u32 \t24" in ptx or
         re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx) is not None,
         "no setmaxnreg.dec 24")
    need(re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx) is not None,
         "no setmaxnreg.inc 240")
    # loads of Q, dO, K, V: one box per swizzle atom (K and V: atoms that the dQ MMA's
    # column halves start on; a head-dim split's Q, dO and V: atoms its halves start on)
    dv = v.head_dim_v or d
    dims = v.config.split == "dims"
    dq_cols = v.kernel_object().dq_cols

    def boxes(cols: int, halves: bool, elem: int = 2) -> int:
        return cols // atom_columns(cols, elem, cols // 2 if halves else None)

    if dims:
        loads = boxes(d, True) + boxes(dv, True) + boxes(d, True) + boxes(dv, True)
    else:
        loads = 2 * boxes(d, False) + 2 * (d // atom_columns(d, 2, dq_cols))
    n_load = len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.shared::\w+\.global", ptx))
    need(n_load == loads, f"{n_load} TMA tensor loads, expected {loads}")
    n_store = len(re.findall(r"cp\.async\.bulk\.tensor\.\w+\.global\.shared::cta", ptx))
    # (dK and dV; a box per swizzle atom of the bf16 / fp16 outputs or the fp32 per-head ones;
    # a head-dim split's rounded ones through sK and sV, its per-head ones from registers)
    if dims:
        stores = 0 if v.per_head else boxes(d, True) + boxes(dv, True)
    else:
        stores = 2 * (d // atom_columns(d, 4 if v.per_head else 2))
    # packed: the rounded dK and dV of a whole KV tile leave by the TMA stores; those of a
    # sequence's last, partial tile, and per head every tile's fp32, from registers by
    # stores predicated on the sequence's end (a TMA store would write the next sequence's
    # rows): BN * d / 256 elements each per math thread, rounded (b16) or fp32 (b32);
    # rectangular kernels write fp32 rows from registers only for per-head chains without
    # visits
    # A head-dim split writes from registers the rounded zeros of a chain without visits
    # and, packed, a sequence's last partial tile (b16 both), besides the per-head fp32 rows.
    packed = getattr(v, "packed", False)
    stores = traces * (0 if packed and v.per_head else stores)
    need(n_store == stores, f"{n_store} TMA tensor stores, expected {stores}")
    per_thread = bn * (d + dv) // 256
    rounded = per_thread * ((dims and not v.per_head) + (packed and not v.per_head))
    want = {"b16": traces * rounded, "b32": traces * per_thread if v.per_head else 0}
    for width, n in want.items() if not v.probe else ():  # (the probe stores its stamps)
        got = len(re.findall(rf"st\.global\.{width}\b", ptx))
        need(got == n, f"{got} st.global.{width} (dK/dV rows), expected {n}")
    return bad


def check_bulk_writer(ptx: str, v: Variant) -> list[str]:
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


#: The approximate instructions each kernel may run: exactly the ones
#: :mod:`dash_ref.arithmetic.mufu` reproduces bit for bit (``ex2_approx_ftz``,
#: ``lg2_approx_ftz``). The backward takes exp2 only ([softmax_p]); the forward also log2
#: ([fwd_finish]).
BACKWARD_APPROX = frozenset({"ex2.approx.ftz.f32"})
FORWARD_APPROX = frozenset({"ex2.approx.ftz.f32", "lg2.approx.ftz.f32"})
# approximate by definition, whatever their modifiers (PTX has no correctly rounded form)
_APPROX_OPS = frozenset({"ex2", "lg2", "sin", "cos", "tanh", "rsqrt"})
# correctly rounded only with an IEEE rounding modifier (else .approx or .full)
_ROUNDED_OPS = frozenset({"rcp", "sqrt", "div"})
_IEEE_ROUNDING = frozenset({"rn", "rz", "rm", "rp"})
_FLOAT_TYPES = frozenset({"f16", "f16x2", "bf16", "bf16x2", "f32", "f64"})
_STATEMENT_HEAD = re.compile(r"^(?:[$\w]+:\s*)*(?:@!?%?\w+\s+)?([a-z][\w]*(?:\.[\w:]+)*)")


def approx_budget(v: Variant | ForwardVariant) -> frozenset[str]:
    """The approximate instructions ``v``'s contract names (a softcap backward's [softcap]
    also takes ``lg2.approx.ftz.f32``, as every forward does)."""
    if isinstance(v, ForwardVariant) or getattr(v, "softcap", False):
        return FORWARD_APPROX
    return BACKWARD_APPROX


def ptx_opcodes(ptx: str) -> collections.Counter[str]:
    """Every instruction of ``ptx`` by its full opcode (``ex2.approx.ftz.f32``), counted.

    Comments are dropped and statements split at ``;`` (inline-asm blocks included); a
    statement's instruction is its first line that starts, past braces, a label and a guard
    predicate (``@%p1``), with an opcode: directives (``.reg``, ``.target``, which has no
    ``;``, ``.param``), braces and a parameter list's ``)`` are not instructions."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", ptx, flags=re.S)
    ops: collections.Counter[str] = collections.Counter()
    for stmt in text.split(";"):
        for line in stmt.splitlines():
            m = _STATEMENT_HEAD.match(line.strip("{} \t\r"))
            if m is not None:
                ops[m.group(1)] += 1
                break
    return ops


def check_approx_ptx(ptx: str, v: Variant | ForwardVariant) -> list[str]:
    """Exactly the approximate instructions the contract names, and no others that compute a
    value; returns the failures.

    The CPU model of the special-function unit (:mod:`dash_ref.arithmetic.mufu`) reproduces
    ``ex2.approx.ftz.f32`` and ``lg2.approx.ftz.f32`` bit for bit and nothing else, so:
    backward kernels may hold ``ex2.approx.ftz.f32`` only, forward kernels and softcap
    backwards also ``lg2.approx.ftz.f32``, and each kernel must hold the ones its contract
    names. Refused:
    any other ``.approx`` instruction (``ex2.approx.f32`` without ``.ftz``, ``rcp.approx``,
    ``sqrt.approx``, ``sin``/``cos``/``tanh.approx``, an f16 ``ex2``), any ``ex2``, ``lg2``,
    ``sin``, ``cos``, ``tanh`` or ``rsqrt`` outside the budget (approximate whatever their
    modifiers), float ``rcp``/``sqrt``/``div`` without an IEEE rounding modifier
    (``div.full.f32``, ``div.approx``; ``rcp.rn.f32`` is correctly rounded and allowed, integer
    ``div.s32`` is exact), and any ``.ftz`` outside the budget: ``add``/``sub``/``mul``/
    ``fma``/``max``/``min`` (and ``cvt``, ``setp``) must keep subnormals, as the CPU model
    does.
    """
    budget = approx_budget(v)
    ops = ptx_opcodes(ptx)
    bad = []
    for op in sorted(ops):
        if op in budget:
            continue
        parts = op.split(".")
        mods = set(parts[1:])
        why = []
        if "approx" in mods or "full" in mods or parts[0] in _APPROX_OPS:
            why.append(f"approximate and not among {', '.join(sorted(budget))} (no bit-exact "
                       "CPU model)")
        elif parts[0] in _ROUNDED_OPS and mods & _FLOAT_TYPES and not mods & _IEEE_ROUNDING:
            why.append("approximate: no IEEE rounding modifier")
        if "ftz" in mods:
            why.append("flushes subnormals (.ftz)" +
                       ("; add/sub/mul/fma/max/min must keep them"
                        if parts[0] in {"add", "sub", "mul", "fma", "max", "min"} else ""))
        if why:
            bad.append(f"{op} ({ops[op]}x): {'; '.join(why)}")
    for op in sorted(budget):
        if ops[op] == 0:
            bad.append(f"no {op}: the contract names it")
    return bad


class SassUnavailable(RuntimeError):
    """No ptxas that accepts the PTX, or no disassembler: the SASS checks cannot run."""


def sass_tools() -> tuple[list[str], list[str]]:
    """(ptxas candidates, disassembler candidates), in the order tried: Triton's bundled
    ``ptxas`` (CUDA 12.8: PTX ISA up to 8.7) and ``ptxas-blackwell`` (CUDA 12.9: ISA 8.8,
    which CuTe DSL writes), then any ``ptxas`` on PATH; Triton's ``cuobjdump``, then its
    ``nvdisasm``, then those on PATH."""
    folders = []
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            folders.append(os.path.join(root, "backends", "nvidia", "bin"))
    path = os.environ.get("PATH", "").split(os.pathsep)

    def found(names, dirs):
        out = []
        for folder in dirs:
            for name in names:
                exe = os.path.join(folder, name)
                if os.path.isfile(exe) and os.access(exe, os.X_OK) and exe not in out:
                    out.append(exe)
        return out

    ptxas = found(("ptxas", "ptxas-blackwell"), folders) + found(("ptxas",), path)
    disasm = found(("cuobjdump", "nvdisasm"), folders) + found(("cuobjdump", "nvdisasm"), path)
    return ptxas, disasm


def assemble_sass(ptx: str) -> str:
    """The SASS of ``ptx`` for sm_90a: the first ptxas of :func:`sass_tools` that accepts it,
    disassembled (``cuobjdump -sass``, else ``nvdisasm``). Raises :class:`SassUnavailable`
    with the reason where none can."""
    ptxas, disasm = sass_tools()
    if not ptxas:
        raise SassUnavailable("ptxas not found (neither Triton's bundled one nor on PATH)")
    if not disasm:
        raise SassUnavailable("no cuobjdump or nvdisasm found")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        errors = []
        for exe in ptxas:
            r = subprocess.run([exe, "-arch=sm_90a", src, "-o", cubin], capture_output=True,
                               text=True)
            if r.returncode == 0:
                break
            lines = (r.stdout + r.stderr).strip().splitlines() or ["(no message)"]
            errors.append(f"{os.path.basename(exe)}: {lines[0][-100:]}")
        else:
            raise SassUnavailable("no ptxas accepts this PTX: " + "; ".join(errors))
        for exe in disasm:
            args = [exe, "-sass", cubin] if "cuobjdump" in exe else [exe, cubin]
            r = subprocess.run(args, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout
        raise SassUnavailable(f"no disassembler reads the cubin: {r.stderr.strip()[:100]}")


# one SASS instruction of cuobjdump (``/*0040*/  @!P0 MUFU.EX2 R5, R0 ;``) or nvdisasm
_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:(@!?U?P\w+)\s+)?([A-Z][\w.]*)"
                        r"\s*([^;]*);", re.M)
_REG = re.compile(r"\bR(\d+)(\.64)?\b")
# ptxas's range scaling around the MUFU for the non-ftz forms (on sm_90a, CUDA 12.8 and 12.9):
#   ex2.approx.f32 y, x:  FSETP.GEU.AND P0, PT, x, -126, PT ; @!P0 FMUL x, x, 0.5 ;
#                         MUFU.EX2 y, x ; @!P0 FMUL y, y, y
#   lg2.approx.f32 y, x:  FSETP.GEU.AND P0, PT, |x|, 1.175494350822287508e-38, PT ;
#                         @!P0 FMUL x, x, 16777216 ; MUFU.LG2 y, x ; @!P0 FADD y, y, -24
_WRAP = {"EX2": (("FMUL", "0.5"), ("FMUL", None)), "LG2": (("FMUL", "16777216"), ("FADD", "-24"))}
_NONFTZ_TEST = re.compile(r"(?:,\s*-126\s*,|\|R\d+\|\s*,\s*1\.17549435\d*e-38\s*,)")


def sass_instructions(sass: str) -> list[tuple[str | None, str, list[str]]]:
    """(guard, opcode, operands) of every instruction, in listing order."""
    return [(m.group(2), m.group(3), [o.strip() for o in m.group(4).split(",") if o.strip()])
            for m in _SASS_LINE.finditer(sass)]


def _regs(operands: list[str]) -> set[int]:
    out = set()
    for o in operands:
        for m in _REG.finditer(o):
            r = int(m.group(1))
            out |= {r, r + 1} if m.group(2) else {r}
    return out


def check_sass(ptx: str, sass: str, window: int = 64) -> list[str]:
    """Each approximate PTX instruction is one bare ``MUFU`` in the SASS; returns the failures.

    ptxas lowers ``ex2.approx.ftz.f32 y, x`` to the single ``MUFU.EX2 y, x`` and
    ``lg2.approx.ftz.f32`` to ``MUFU.LG2 y, x``: the units :mod:`dash_ref.arithmetic.mufu`
    measured. The non-ftz forms keep subnormals by range scaling around the same MUFU::

        ex2.approx.f32:  FSETP.GEU.AND P0, PT, x, -126, PT ; @!P0 FMUL x, x, 0.5 ;
                         MUFU.EX2 y, x ; @!P0 FMUL y, y, y
        lg2.approx.f32:  FSETP.GEU.AND P0, PT, |x|, 1.175494350822287508e-38, PT ;
                         @!P0 FMUL x, x, 16777216 ; MUFU.LG2 y, x ; @!P0 FADD y, y, -24

    which gives other values than the model (subnormal results of ex2, subnormal inputs of
    lg2). Checked, on the SASS (one kernel or several):

    1. every ``MUFU.EX2`` / ``MUFU.LG2`` is bare: no suffix on the opcode (``.F16``) and a
       plain register in and out (no ``|.|`` operand modifier), but for a negated source of
       ``MUFU.EX2``: ptxas folds the contract's ``neg.f32`` before an ``ex2`` ([softcap]'s
       ``ex2(-lg2(...))``) into it, so the unit reads the sign-flipped register, which is
       the bare instruction of ``-x`` (a sign flip is exact, and the model was validated on
       every input); the folds appear at d = 192 and 256 (not at 96 or 128);
    2. none is wrapped: the last instruction before it (within ``window``) that writes its
       input is not the pre-scaling ``FMUL x, x, 0.5`` (EX2) / ``FMUL x, x, 16777216``
       (LG2), and the first one after it that names its output is not the squaring
       ``FMUL y, y, y`` / the ``FADD y, y, -24`` (whatever the guards; ptxas may schedule
       other instructions in between), and no ``FSETP`` makes the range test (against
       ``-126``, or ``|x|`` against the smallest normal ``1.17549435e-38``);
    3. the counts match the PTX: as many ``MUFU.EX2`` as ``ex2.approx.ftz.f32`` and as many
       ``MUFU.LG2`` as ``lg2.approx.ftz.f32``. ptxas lowers each of those to exactly one MUFU
       and nothing else the PTX may hold (:func:`check_approx_ptx`) to ``MUFU.EX2`` /
       ``MUFU.LG2``, so equal counts say every MUFU of these kinds is one of the contract's
       instructions, none was lowered some other way (a software sequence) or dropped, and
       ptxas did not duplicate one into several paths (which the one-to-one tables of the
       contract would then have to name): where it legitimately does, this check fails and
       asks for a look;
    4. no other MUFU function: ``MUFU.RCP`` only where the PTX holds ``rcp.rn.f32`` or
       integer ``div``/``rem`` (ptxas's correctly rounded reciprocal and exact integer
       division start from ``MUFU.RCP`` and refine it, so it reaches no value unrefined;
       its count is not pinned, since the rcp.rn slow path holds further ones); no
       ``MUFU.RSQ``, ``SQRT``, ``SIN``, ``COS``, ``TANH``, ``RCP64H`` at all.
    """
    ops = ptx_opcodes(ptx)
    insts = sass_instructions(sass)
    bad = []
    if not insts:
        return ["no SASS instructions in the listing"]
    want = {"EX2": ops["ex2.approx.ftz.f32"], "LG2": ops["lg2.approx.ftz.f32"]}
    seen = collections.Counter()
    wrapped = collections.Counter()
    range_tests = []
    for i, (_, op, args) in enumerate(insts):
        if not op.startswith("MUFU"):
            if op.startswith("FSETP") and _NONFTZ_TEST.search(", ".join(args) + ","):
                range_tests.append(f"{op} {', '.join(args)}")
            continue
        func = op.split(".")[1] if "." in op else "?"
        base = f"MUFU.{func}"
        seen[base] += 1
        if func not in want:
            exact_rcp = (ops["rcp.rn.f32"] > 0
                         or any(o.split(".")[0] in ("div", "rem") and
                                set(o.split(".")[1:]) & {"s32", "u32", "s64", "u64"}
                                for o in ops))
            if not (func == "RCP" and exact_rcp):
                bad.append(f"{op} {', '.join(args)}: no approximate instruction of the contract "
                           "lowers to it")
            continue
        negated = func == "EX2" and len(args) == 2 and re.fullmatch(r"-R\d+", args[1])
        source = args[1:2] if not negated else [args[1][1:]]
        if op != base or len(args) != 2 or not all(re.fullmatch(r"R\d+", a)
                                                   for a in args[:1] + source):
            bad.append(f"{op} {', '.join(args)} is not a bare {base} Rd, Rs")
            continue
        dst, src = int(args[0][1:]), int(source[0][1:])
        (pre_op, pre_imm), (post_op, post_imm) = _WRAP[func]
        scaled_in = scaled_out = False
        for _, op2, args2 in reversed(insts[max(0, i - window):i]):  # the input's writer
            if args2 and _regs(args2[:1]) & {src} and not op2.startswith(("ST", "RED", "ATOM")):
                scaled_in = op2.split(".")[0] == pre_op and args2[-1] == pre_imm
                break
        for _, op2, args2 in insts[i + 1:i + 1 + window]:  # the output's first use
            if _regs(args2) & {dst}:
                scaled_out = (op2.split(".")[0] == post_op and len(args2) == 3
                              and args2[1] == f"R{dst}"
                              and args2[2] == (post_imm or f"R{dst}"))
                break
        wrapped[base] += scaled_in or scaled_out
    if range_tests:
        bad.append(f"{len(range_tests)} FSETP range test(s) of a non-ftz ex2/lg2, such as "
                   f"{range_tests[0]}")
    for base, n in sorted(wrapped.items()):
        if n:
            bad.append(f"{n} {base} wrapped by range-scaling FMUL/FADD: the non-ftz form, not "
                       "the bare MUFU of the .ftz one")
    for func, n in want.items():
        if seen[f"MUFU.{func}"] != n:
            name = "ex2" if func == "EX2" else "lg2"
            bad.append(f"{seen[f'MUFU.{func}']} MUFU.{func} in the SASS, {n} "
                       f"{name}.approx.ftz.f32 in the PTX")
    return bad


def check_mufu_sass(ptx: str) -> list[str]:
    """:func:`check_sass` of ``ptx`` assembled by :func:`assemble_sass` (which raises
    :class:`SassUnavailable` where it cannot run)."""
    return check_sass(ptx, assemble_sass(ptx))


def compile_ptx(v: Variant, folder: str) -> tuple[object, str, str, float]:
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


def check_launch_registers(report: str, v: Variant | ForwardVariant) -> list[str]:
    """The backward's residency (``launch.ctas_per_sm``) assumes ``REGISTERS_AT_LAUNCH``
    registers per thread: ptxas must agree (nothing to check where ptxas did not run)."""
    m = re.match(r"regs=(\d+)", report)
    if m is None or not isinstance(v, Variant):
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
    """``staging_coords`` (the dQacc tile order) equals the MMA's own partition of the tile,
    at every head dim, and with the dQ MMA on one warpgroup (``dq_one_warpgroup``) where a
    head dim's tiles allow it: the kernel's staging slots (``s_dq``) put register ``r`` of
    thread ``t`` of warpgroup ``w`` at ``w * part + (r // 4) * 512 + 4 t + r % 4``."""
    found: dict = {}

    @cute.jit
    def probe(k: cutlass.Constexpr):
        mma_dq = k._tiled_mmas()[-1]
        ident = cute.make_identity_tensor((k.bm, k.d))
        for t in list(range(128 * k.dq_warpgroups)):  # a Python loop at trace time
            part = mma_dq.get_slice(t).partition_C(ident)
            found[t] = [part[e] for e in range(cute.size(part))]

    bad = []
    for d in HEAD_DIMS:
        v = backward_variant(torch.bfloat16, d, "full", True, audit=False, per_head=False)
        kernels = [v]
        if v.config.block_m == 64 and v.config.split == "keys":
            kernels.append(replace(v, config=replace(v.config, dq_one_warpgroup=True)))
        for v in kernels:
            found.clear()
            k = v.kernel_object()
            cute.compile(probe, k, options="--gpu-arch=sm_90a")
            coords = staging_coords(k.bm, d)
            part = k.bm * d // k.dq_warpgroups
            for t, regs in found.items():
                w, tl = divmod(t, 128)
                for r, rc in enumerate(regs):
                    pos = w * part + (r // 4) * 512 + 4 * tl + r % 4
                    if tuple(int(x) for x in rc) != coords[pos]:
                        bad.append(f"{v.config.name} d={d}: thread {t} register {r} is {rc}, "
                                   f"staging says {coords[pos]}")
                        break
        if sorted(coords) != [(r, c) for r in range(k.bm) for c in range(d)]:
            bad.append(f"d={d}: staging order is not a permutation of the tile")
    return bad


def check_o_chunks() -> list[str]:
    """Chunk ``c`` of a forward's staged O (``store_o_tma``) is the ``c``-th run of
    ``size(chunk)`` elements of the thread's O registers: the chunk MMA's partition, shifted
    by ``c * o_cols`` columns, is the full tile's, element by element, for every thread of a
    warpgroup and every configuration the forward ships."""
    found: dict = {}

    @cute.jit
    def probe(k: cutlass.Constexpr):
        _, mma_pv, mma_o = k._tiled_mmas()
        full = cute.make_identity_tensor((k.bm, k.dv))
        chunk = cute.make_identity_tensor((64, k.o_cols))
        for t in list(range(128)):  # a Python loop at trace time
            whole = mma_pv.get_slice(t).partition_C(full)
            part = mma_o.get_slice(t).partition_C(chunk)
            found[t] = ([whole[e] for e in range(cute.size(whole))],
                        [part[e] for e in range(cute.size(part))])

    bad = []
    # one kernel per (d, d_v, configuration): the mask and the flags leave the MMAs as they are
    variants: dict = {}
    for v in shipped_variants((torch.bfloat16,)):
        if isinstance(v, ForwardVariant) and not (v.packed or v.sinks or v.softcap):
            variants.setdefault((v.head_dim, v.head_dim_v, v.config), v)
    for v in variants.values():
        found.clear()
        k = v.kernel_object()
        cute.compile(probe, k, options="--gpu-arch=sm_90a")
        for t, (whole, part) in found.items():
            # thread t < 128 is of warpgroup 0: its rows of the full tile are its chunk's
            want = [(int(r), int(col) + c * k.o_cols) for c in range(k.dv // k.o_cols)
                    for r, col in part]
            if [(int(r), int(col)) for r, col in whole] != want:
                bad.append(f"{v.name}: thread {t}'s O registers are not its chunks in order")
                break
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "dash_cute_ptx"))
    ap.add_argument("--export", default=None, help="write AOT objects to this directory")
    ap.add_argument("--quick", action="store_true", help="d=64 bf16 only")
    ap.add_argument("--head-dims", type=int, nargs="+", default=None,
                    help="these head dims only (default: every one)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    failures = 0

    bad = check_staging_layout()
    print(f"staging layout vs partition_C: {'OK' if not bad else 'FAIL'}")
    for b in bad[:5]:
        print("   ", b)
    failures += bool(bad)
    bad = check_o_chunks()
    print(f"forward O chunks vs partition_C: {'OK' if not bad else 'FAIL'}")
    for b in bad[:5]:
        print("   ", b)
    failures += bool(bad)

    rows = []
    sass_skipped = None
    head_dims = tuple(args.head_dims) if args.head_dims else None
    for v in all_variants(args.quick, head_dims):
        try:
            kernel, ptx, ptx_path, seconds = compile_ptx(v, os.path.join(args.out, v.name))
        except Exception as e:  # noqa: BLE001 - report and go on with the other variants
            print(f"{v.name}: COMPILE FAILED: {type(e).__name__}: {str(e)[:500]}")
            failures += 1
            continue
        bad = check_ptx(ptx, v) + check_approx_ptx(ptx, v)
        try:
            bad += check_mufu_sass(ptx)
        except SassUnavailable as e:
            sass_skipped = str(e)
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
        names = launch.export_kernels(all_variants(args.quick, head_dims), args.export)
        print(f"exported {len(names)} AOT objects to {args.export} in {time.time() - t0:.1f}s")
    times = [r[1] for r in rows]
    if times:
        print(f"compile time per variant: min {min(times):.1f}s  median "
              f"{sorted(times)[len(times) // 2]:.1f}s  max {max(times):.1f}s  "
              f"({len(times)} variants)")
    if sass_skipped is not None:
        print(f"SASS checks (bare MUFU.EX2 / MUFU.LG2) SKIPPED: {sass_skipped}")
    print("ALL CHECKS PASSED" if failures == 0 else f"{failures} FAILURE(S)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
