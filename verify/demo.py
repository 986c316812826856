"""The CPU demo: every schedule on one small problem, its bits, and its accuracy.

For each mask, the same random bf16 inputs go through the tile-level emulator under every
schedule. The table shows each schedule's fingerprint, how many elements of the fp32
accumulators and of the rounded dQ, dK and dV differ bitwise from ``naive``, and the error
of each against gradients computed in 50-digit ``mpmath`` from the same inputs: equally
accurate, differently rounded. Rounding to bf16 hides most fp32 differences, not all of
them. Last, one dQ element's running fp32 sum under ``naive`` and ``shift`` side by side,
showing the addition at which rounding parts them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from dash_ref import NAMES, Problem, build_schedule
from dash_ref.arithmetic.numerics import ulp
from dash_ref.cpu import single_threaded
from dash_ref.emulate import emulate
from verify.compare import compare, dq_divergence, first_dq_mismatch
from verify.highprec import grad_error_reports, reference_grads


@dataclass
class DemoRow:
    mask: str
    schedule: str
    fingerprint: str
    acc_diff: tuple[int, int, int]  # fp32 dQacc, dKacc, dVacc elements != naive
    out_diff: tuple[int, int, int]  # rounded dQ, dK, dV elements != naive
    max_ulp: float  # largest error in ulps of max(|exact|, rms(exact))
    normwise: float
    within_bound: bool


def random_inputs(p: Problem, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded standard-normal ``q, k, v, do`` in ``(B, S, H, d)`` layout."""
    gen = torch.Generator().manual_seed(seed)

    def draw(s: int, h: int) -> torch.Tensor:
        return torch.randn(p.batch, s, h, p.head_dim, generator=gen).to(dtype)

    return (draw(p.seqlen_q, p.heads), draw(p.seqlen_k, p.heads_kv),
            draw(p.seqlen_k, p.heads_kv), draw(p.seqlen_q, p.heads))


@single_threaded
def run_demo(seqlen: int = 256, head_dim: int = 32, block: int = 32, heads: int = 4,
             heads_kv: int = 2, workers: int = 4, seed: int = 0,
             dtype: torch.dtype = torch.bfloat16, log=print) -> dict:
    """Run the demo, print its tables through ``log``, and return the rows as data."""
    t0 = time.perf_counter()
    rows: list[DemoRow] = []
    traces = {}
    for mask in ("full", "causal"):
        p = Problem(1, heads, heads_kv, seqlen, seqlen, head_dim, mask, block, block)
        q, k, v, do = random_inputs(p, dtype, seed)
        log(f"[{mask}] mpmath reference (50 digits) for B=1 H={heads} H_kv={heads_kv} "
            f"S={seqlen} d={head_dim} ...")
        exact = reference_grads(q, k, v, do, causal=mask == "causal", dps=50)
        results = {}
        for name in NAMES:
            sched = build_schedule(p, name, workers).validate()
            _, bwd = emulate(sched, q, k, v, do, return_partials=True, arrival_seed=seed)
            results[name] = (sched, bwd)
        base = results["naive"][1]
        for name, (sched, bwd) in results.items():
            reports = grad_error_reports(exact, bwd.dq, bwd.dk, bwd.dv).values()
            rows.append(DemoRow(
                mask, name, sched.fingerprint(),
                tuple(compare("acc", getattr(bwd, f), getattr(base, f)).differing
                      for f in ("dq_acc", "dk_acc", "dv_acc")),
                tuple(compare("out", getattr(bwd, f), getattr(base, f)).differing
                      for f in ("dq", "dk", "dv")),
                max(floored_ulp_error(getattr(bwd, g), getattr(exact, g), dtype)
                    for g in ("dq", "dk", "dv")),
                max(r.normwise for r in reports),
                all(r.normwise <= r.bound for r in reports)))
        if mask == "full":
            trace = dq_trace(results["naive"], results["shift"], head_dim)
            if trace is not None:
                traces[mask] = trace
    log("")
    log(format_table(rows, dtype))
    for _, text in traces.values():
        log("")
        log(text)
    log(f"\ndone in {time.perf_counter() - t0:.1f} s")
    return {"rows": [asdict(r) for r in rows],
            "traces": {m: {"element": d.element, "step": d.step}
                       for m, (d, _) in traces.items()}}


def dq_trace(run_a, run_b, head_dim: int, labels: tuple[str, str] = ("naive", "shift")):
    """``(Divergence, text)`` for one dQ element of two ``(schedule, backward)`` runs: the
    first whose *rounded* value differs (else the first whose fp32 accumulator does), its
    running sums step by step and the two rounded values; None if every element agrees.
    Section 4 of the docs prints the same trace (``docs/bits.py``)."""
    (s_a, a), (s_b, b) = run_a, run_b
    element = first_dq_mismatch(a.dq, b.dq) or first_dq_mismatch(a.dq_acc, b.dq_acc)
    if element is None:
        return None
    div = dq_divergence(s_a, a.partials, s_b, b.partials, element, labels)
    ra, rb = a.dq[element], b.dq[element]
    text = (div.table() + "\n" +
            f"  after scaling by 1/sqrt(d) = {head_dim ** -0.5:g} and rounding to "
            f"{ {torch.bfloat16: 'bf16', torch.float16: 'fp16'}[a.dq.dtype]}: "
            f"{labels[0]} {float(ra):.6g} [{_hex16(ra)}], {labels[1]} {float(rb):.6g} "
            f"[{_hex16(rb)}]")
    return div, text


def _hex16(x: torch.Tensor) -> str:
    """The 16 raw bits of a bf16/fp16 scalar, as 4 hex digits."""
    return f"{x.reshape(1).view(torch.int16).item() & 0xFFFF:04x}"


def floored_ulp_error(x: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest ``|x - exact|`` in ulps of ``max(|exact|, rms(exact))``.

    Plain ulp errors explode where a gradient cancels to nearly nothing (the ulp of a tiny
    exact value is tiny); flooring the magnitude at the tensor's rms keeps the number about
    the rounding of the values that matter.
    """
    exact = exact.double()
    rms = exact.square().mean().sqrt()
    return float(((x.double() - exact).abs() / ulp(exact.abs().clamp(min=rms), dtype)).max())


def format_table(rows: list[DemoRow], dtype: torch.dtype) -> str:
    """The demo's table: one row per (mask, schedule)."""
    head = (f"{'mask':<7}{'schedule':<17}{'fingerprint':<18}{'fp32 acc != naive':>20}"
            f"{'output != naive':>18}{'ulp':>7}{'normwise':>10}  bound")
    lines = [head, "-" * len(head)]
    for r in rows:
        acc = "/".join(map(str, r.acc_diff))
        out = "/".join(map(str, r.out_diff))
        lines.append(f"{r.mask:<7}{r.schedule:<17}{r.fingerprint:<18}{acc:>20}{out:>18}"
                     f"{r.max_ulp:>7.1f}{r.normwise:>10.2e}  "
                     f"{'ok' if r.within_bound else 'EXCEEDED'}")
    lines.append(f"(elements of dQ/dK/dV whose bits differ from naive, as fp32 accumulators and "
                 f"rounded to {str(dtype).removeprefix('torch.')};\nerrors against mpmath, worst "
                 "of dQ/dK/dV: largest error in ulps of max(|exact|, rms), and normwise, "
                 "each held to\nits bound from verify.highprec.error_bound)")
    return "\n".join(lines)
