"""Where the CuTe backward's time goes inside the kernel: per-visit and per-chain phase times.

Runs the probe variant of the CuTe kernel (``dash_cuda.backends.cute.launch.probing``: the
same gradients, plus ``%clock`` stamps at phase boundaries, see ``bwd_kernel.py``) on cells of
the paper's grid and reports medians over every CTA of:

* a visit's phases (math warpgroup 0): waiting for Q/dO, the S and dP MMAs with the softmax,
  dS and its barrier, waiting for a free staging buffer, staging and dK; the period between
  visits of one chain; the dQ writer's wait for its turn and the add's latency;
* a chain's boundary: waiting for K/V, the dK/dV epilogue, and the bubble from the last visit
  of a chain to the first visit of the next having its data;
* the share of the kernel spent in chain boundaries.

Cycles become microseconds with the clock the run itself shows (cycles spanned by the
busiest CTA over the kernel's GPU time)::

    PYTHONPATH=. python benchmarks/probe_backward.py --out benchmarks/results \
        --cells 64:full:512 128:full:4096 --schedules shift atomic
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from harness import (
    HIDDEN,
    TOKENS,
    cute_probe_slots,
    grid_inputs,
    kernel_times,
    no_cuda,
    parse_cell,
    save_report,
)

PHASES = {  # name: (from slot, to slot), visit slots of bwd_kernel's probe
    "wait Q/dO": (0, 1), "S, dP, softmax": (1, 2), "dS + barrier": (2, 3),
    "wait staging": (3, 4), "stage + dK": (4, 5),
}


def _median_us(values, ghz: float) -> float:
    return round(statistics.median(values) / ghz / 1e3, 3) if len(values) else float("nan")


def analyse(stamps: np.ndarray, tables: dict, kernel_us: float, deterministic: bool) -> dict:
    """Phase medians (us) from the stamps of one probed launch."""
    visit_slots, chain_slots = cute_probe_slots()
    n_vis = len(tables["visit_q"])
    v = stamps[:n_vis * visit_slots].reshape(n_vis, visit_slots).astype(np.int64)
    ch = stamps[n_vis * visit_slots:].reshape(-1, chain_slots).astype(np.int64)
    wrap = lambda x: np.mod(x, 2**32)  # noqa: E731 - %clock is a wrapping 32-bit counter
    offsets, workers = tables["chain_offsets"], tables["worker_offsets"]
    phases = {name: [] for name in PHASES}
    period, turn, add, kv, epi, bubble = [], [], [], [], [], []
    spans, boundary = [], []
    for w in range(len(workers) - 1):
        c0, c1 = workers[w], workers[w + 1]
        if c0 == c1:
            continue
        spans.append(wrap(ch[c1 - 1, 3] - ch[c0, 0]))
        lost = 0
        for c in range(c0, c1):
            a, b = offsets[c], offsets[c + 1]
            kv.append(wrap(ch[c, 1] - ch[c, 0]))
            epi.append(wrap(ch[c, 3] - ch[c, 2]))
            if c > c0 and b > a and offsets[c] > offsets[c - 1]:
                gap = wrap(v[a, 1] - v[offsets[c] - 1, 5])
                bubble.append(gap)
                lost += gap
            for x in range(a, b):
                if x > a:  # steady state: not a chain's first visit
                    for name, (s, e) in PHASES.items():
                        phases[name].append(wrap(v[x, e] - v[x, s]))
                    period.append(wrap(v[x, 0] - v[x - 1, 0]))
                turn.append(wrap(v[x, 6] - v[x, 4]))
                if deterministic:  # the atomic writer does not wait for its adds
                    add.append(wrap(v[x, 7] - v[x, 6]))
        boundary.append(lost / max(spans[-1], 1))
    ghz = max(spans) / kernel_us / 1e3
    out = {"clock_ghz": round(ghz, 3), "kernel_us": round(kernel_us, 1),
           "visit_period_us": _median_us(period, ghz)}
    out.update({f"visit: {k}": _median_us(x, ghz) for k, x in phases.items()})
    out.update({"dq writer: staged -> turn": _median_us(turn, ghz),
                "dq writer: add latency": _median_us(add, ghz),
                "chain: wait K/V": _median_us(kv, ghz),
                "chain: dK/dV epilogue": _median_us(epi, ghz),
                "chain: bubble (last visit end -> next visit data ready)":
                    _median_us(bubble, ghz),
                "share of kernel in chain bubbles": round(float(np.median(boundary)), 3)})
    return out


def probe_cell(d: int, mask: str, s: int, schedule: str, gen) -> dict:
    import torch

    import dash_cuda
    from dash_cuda import backward_problem
    from dash_cuda.backends.cute.launch import probing
    from dash_cuda.tables import device_schedule

    h, b = HIDDEN // d, TOKENS // s
    causal = mask == "causal"
    q, k, v, do = grid_inputs(d, s, gen)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend="cute")
    det = schedule != "atomic"
    workers = torch.cuda.get_device_properties(0).multi_processor_count
    name = schedule if det else "auto"
    problem = backward_problem(b, h, h, s, s, d, causal, backend="cute")
    sched = device_schedule(problem, schedule if det else "atomic", workers, q.device)
    tables = {key: t.cpu().numpy() for key, t in sched.tables.items()}
    visit_slots, chain_slots = cute_probe_slots()
    stamps = torch.zeros(len(tables["visit_q"]) * visit_slots
                         + (len(tables["chain_offsets"]) - 1) * chain_slots,
                         device="cuda", dtype=torch.int32)

    def bwd():
        with probing(stamps):
            return dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                                schedule=name, deterministic=det,
                                                backend="cute")

    times = kernel_times(bwd, 5)
    kernel_us = max(t for n, t in times.items() if "DashBackward" in n)
    bwd()
    torch.cuda.synchronize()
    return analyse(stamps.cpu().numpy(), tables, kernel_us, det)


def markdown(report: dict) -> str:
    rows = report["results"]
    keys = [k for k in rows[0] if k not in ("d", "mask", "S", "schedule")]
    lines = [f"# Inside the CuTe backward: phase medians in us ({report['environment']})", "",
             "| d | mask | S | schedule | " + " | ".join(keys) + " |",
             "|---" * (4 + len(keys)) + "|"]
    for r in rows:
        lines.append(f"| {r['d']} | {r['mask']} | {r['S']} | {r['schedule']} | "
                     + " | ".join(str(r[k]) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tag", default="probe_backward")
    ap.add_argument("--cells", type=parse_cell, nargs="+",
                    default=[(64, "full", 512), (64, "full", 4096), (128, "full", 512),
                             (128, "full", 4096)], help="D:MASK:S")
    ap.add_argument("--schedules", nargs="+", default=["shift", "atomic"])
    args = ap.parse_args(argv)

    if no_cuda("probe_backward"):
        return 2
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for d, mask, s in args.cells:
        for schedule in args.schedules:
            r = {"d": d, "mask": mask, "S": s, "schedule": schedule,
                 **probe_cell(d, mask, s, schedule, gen)}
            print(r, flush=True)
            results.append(r)
    report = {"environment": f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
              "results": results}
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
