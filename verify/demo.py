"""The CPU demo: every schedule on one small problem, its bits, and its accuracy.

For each mask, the same random bf16 inputs go through the tile-level emulator under every
schedule. The table shows each schedule's fingerprint, how many elements of dQ, dK and dV
differ bitwise from ``naive``, and the error of each against gradients computed in
50-digit ``mpmath`` from the same inputs: equally accurate, differently rounded. Last, one
dQ element's running fp32 sum under ``naive`` and ``shift`` side by side, showing the
addition at which rounding parts them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from dash_ref import NAMES, Problem, build_schedule
from dash_ref.emulate import emulate
from verify.compare import compare, dq_divergence, first_dq_mismatch
from verify.highprec import error_bound, error_report, reference_grads


@dataclass
class DemoRow:
    mask: str
    schedule: str
    fingerprint: str
    dq_diff: int
    dk_diff: int
    dv_diff: int
    max_ulp: float
    normwise: float
    within_bound: bool


def random_inputs(p: Problem, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded standard-normal ``q, k, v, do`` in ``(B, S, H, d)`` layout."""
    gen = torch.Generator().manual_seed(seed)

    def draw(s: int, h: int) -> torch.Tensor:
        return torch.randn(p.batch, s, h, p.head_dim, generator=gen).to(dtype)

    return (draw(p.seqlen_q, p.heads), draw(p.seqlen_k, p.heads_kv),
            draw(p.seqlen_k, p.heads_kv), draw(p.seqlen_q, p.heads))


def run_demo(seqlen: int = 64, head_dim: int = 16, block: int = 16, heads: int = 2,
             heads_kv: int = 1, workers: int = 4, seed: int = 0,
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
        bound = error_bound(dtype)
        for name, (sched, bwd) in results.items():
            reports = [error_report(x, e, dtype) for x, e in
                       ((bwd.dq, exact.dq), (bwd.dk, exact.dk), (bwd.dv, exact.dv))]
            normwise = max(r.normwise for r in reports)
            rows.append(DemoRow(
                mask, name, sched.fingerprint(),
                compare("dQ", bwd.dq, base.dq).differing,
                compare("dK", bwd.dk, base.dk).differing,
                compare("dV", bwd.dv, base.dv).differing,
                max(r.max_ulp for r in reports), normwise, normwise <= bound))
        if mask == "full":
            s_a, b_a = results["naive"]
            s_b, b_b = results["shift"]
            element = first_dq_mismatch(b_a.dq_acc, b_b.dq_acc)
            if element is not None:
                traces[mask] = dq_divergence(s_a, b_a.partials, s_b, b_b.partials, element,
                                             ("naive", "shift"))
    log("")
    log(format_table(rows, dtype, error_bound(dtype)))
    for div in traces.values():
        log("")
        log(div.table())
    log(f"\ndone in {time.perf_counter() - t0:.1f} s")
    return {"rows": [asdict(r) for r in rows],
            "traces": {m: {"element": d.element, "step": d.step} for m, d in traces.items()}}


def format_table(rows: list[DemoRow], dtype: torch.dtype, bound: float) -> str:
    head = (f"{'mask':<7}{'schedule':<17}{'fingerprint':<18}{'dQ!=naive':>10}{'dK!=naive':>10}"
            f"{'dV!=naive':>10}{'max ulp':>9}{'normwise':>11}  bound")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.mask:<7}{r.schedule:<17}{r.fingerprint:<18}{r.dq_diff:>10}"
                     f"{r.dk_diff:>10}{r.dv_diff:>10}{r.max_ulp:>9.1f}{r.normwise:>11.2e}  "
                     f"{'ok' if r.within_bound else 'EXCEEDED'}")
    lines.append(f"(bits compared with naive; errors against mpmath, worst of dQ/dK/dV, in "
                 f"{str(dtype).removeprefix('torch.')} ulps and normwise; bound {bound:.2e})")
    return "\n".join(lines)
