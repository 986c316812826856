"""What rectangular problems give today: their repr and tiles, fingerprints, kernel tables,
model makespans and emulator bits, as hashes, to hold packed-batch support to "a
rectangular problem behaves exactly as before".

``tests/data/rectangular_baseline.json`` was written by this module run against the code
of the commit before variable lengths (459e658), never by the code under test, with one
change to that code: its fp32 ``torch.log2`` and ``torch.exp2`` (the IEEE and exact
forward's ``P``, ``alpha`` and ``LSE2 = m + log2(l)``, the IEEE backward's ``P``) correctly
rounded, in float64 then to fp32, as ``dash_ref`` computes them (``steps.exp2_rn``,
``steps.log2_rn``) since torch's fp32 routines were found to give other bits on AVX2 hosts
than on AVX-512 ones, Intel's and AMD's (the steps' contract says correctly rounded)::

    git worktree add /tmp/varlen_base 459e658
    cd /tmp/varlen_base && PYTHONPATH=/tmp/varlen_base python -c "
    import runpy, sys, torch
    log2, exp2 = torch.log2, torch.exp2
    torch.log2 = lambda x: log2(x.double()).float() if x.dtype == torch.float32 else log2(x)
    torch.exp2 = lambda x: exp2(x.double()).float() if x.dtype == torch.float32 else exp2(x)
    sys.argv = ['', 'OUT.json']; runpy.run_path('PATH/TO/tests/rectangular_baseline.py',
                                                run_name='__main__')"

(run from the worktree, so that its ``dash_ref`` is the one imported).

It uses only what that commit has; ``tests/test_varlen_problem.py`` measures the same
things with the current code and compares.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import torch

BASE_COMMIT = "459e658"
PROBLEMS = [  # (B, H, H_kv, S_q, S_k, d, mask, BM, BN)
    (1, 2, 2, 48, 48, 16, "full", 16, 16),
    (2, 4, 2, 37, 70, 16, "causal", 16, 16),
    (3, 2, 1, 70, 37, 8, "causal", 16, 8),
    (2, 4, 4, 1000, 1000, 64, "causal", 128, 128),
    (1, 6, 2, 700, 1300, 128, "causal", 64, 128),
    (2, 8, 8, 512, 512, 64, "full", 64, 64),
    (2, 3, 3, 0, 50, 16, "causal", 16, 16),
    (1, 2, 2, 40, 0, 16, "full", 16, 16),
]
WORKERS = (1, 5, 132)
EMULATED = [  # (problem index, schedule names)
    (1, ("naive", "shift", "atomic")),
    (2, ("descending", "symmetric_shift")),
]
ARITHMETICS = ("ieee", "exact", "fast")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:20]


def _array(a: np.ndarray) -> str:
    return _digest(repr((a.dtype.str, a.shape)).encode(), np.ascontiguousarray(a).tobytes())


def _tensor(t: torch.Tensor) -> str:
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}[t.dtype]
    return _digest(repr((str(t.dtype), tuple(t.shape))).encode(),
                   t.contiguous().view(bits).numpy().tobytes())


def measure() -> dict:
    """Every number and hash the baseline file holds, computed by the code imported."""
    from dash_ref import NAMES, Problem, build_schedule
    from dash_ref.emulate import emulate
    from dash_ref.model import critical_path, simulate

    out: dict = {"schedules": {}, "emulated": {}, "problems": {}}
    problems = [Problem(*shape) for shape in PROBLEMS]
    for n, p in enumerate(problems):
        out["problems"][str(n)] = {"repr": repr(p), "flops": p.flops_forward(), "n_q": p.n_q,
                                   "n_kv": p.n_kv, "pairs": p.num_pairs,
                                   "chain_rows": repr(p.chain_rows)}
        for name in NAMES:
            for w in WORKERS:
                s = build_schedule(p, name, w).validate()
                tables = s.to_tables().as_dict()
                orders = sorted(s.dq_orders.items())
                entry = {
                    "fingerprint": s.fingerprint(),
                    "tables": {k: _array(a) for k, a in tables.items()},
                    "workers": _digest(repr(s.workers).encode()),
                    "dq_orders": _digest(repr(orders).encode()),
                    "describe": _digest(s.describe().encode()),
                    "sync": critical_path(s, "sync", 1.0, 0.5, partial=True).length,
                    "async2": simulate(s, "async", 1.0, 0.75, partial=True,
                                       staging=2).makespan,
                    "latency": simulate(s, "sync", 1.0, 0.25, handoff_latency=0.5).makespan,
                }
                out["schedules"][f"{n}/{name}/{w}"] = entry
    for n, names in EMULATED:
        p = problems[n]
        gen = torch.Generator().manual_seed(1000 + n)
        q, k, v, do = (torch.randn(p.batch, s, h, p.head_dim, generator=gen).to(torch.bfloat16)
                       for s, h in ((p.seqlen_q, p.heads), (p.seqlen_k, p.heads_kv),
                                    (p.seqlen_k, p.heads_kv), (p.seqlen_q, p.heads)))
        for name in names:
            s = build_schedule(p, name, 3)
            for arith in ARITHMETICS:
                fwd, bwd = emulate(s, q, k, v, do, return_partials=True, arrival_seed=7,
                                   arithmetic=arith)
                out["emulated"][f"{n}/{name}/{arith}"] = {
                    "o": _tensor(fwd.o), "lse2": _tensor(fwd.lse2),
                    **{x: _tensor(getattr(bwd, x)) for x in (
                        "dq", "dk", "dv", "dq_acc", "dk_acc", "dv_acc", "partials")}}
    return out


if __name__ == "__main__":
    data = {"commit": BASE_COMMIT, **measure()}
    with open(sys.argv[1], "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
