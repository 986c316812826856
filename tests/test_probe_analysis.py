"""``benchmarks/probe_backward.py``'s arithmetic on stamps whose phase times are known."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
probe = pytest.importorskip("probe_backward")

VISIT, CHAIN = 8, 4  # slots per visit and per chain (bwd_kernel.PROBE_*_SLOTS)
PHASE = [11, 13, 17, 19, 23]  # cycles of visit phases 0->1, 1->2, ..., 4->5
KV, EPILOGUE, TAIL = 29, 31, 7  # chain: wait for K/V; dK/dV; last stamp -> next chain


def synthetic(chains_per_worker: list[list[int]], start: int) -> tuple[np.ndarray, dict]:
    """Stamps of workers running chains of the given visit counts, from clock ``start``."""
    counts = [n for w in chains_per_worker for n in w]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    workers = np.concatenate([[0], np.cumsum([len(w) for w in chains_per_worker])])
    n_vis, n_ch = int(offsets[-1]), len(counts)
    st = np.zeros(n_vis * VISIT + n_ch * CHAIN, np.int64)
    c = 0
    for w in chains_per_worker:
        t = start
        for _ in w:
            ch = n_vis * VISIT + c * CHAIN
            st[ch] = t
            t += KV
            st[ch + 1] = t
            for x in range(offsets[c], offsets[c + 1]):
                for k, dt in enumerate(PHASE):
                    st[x * VISIT + k] = t
                    t += dt
                st[x * VISIT + 5] = t
                st[x * VISIT + 6] = st[x * VISIT + 4] + 3
                st[x * VISIT + 7] = st[x * VISIT + 6] + 5
            st[ch + 2] = t
            t += EPILOGUE
            st[ch + 3] = t
            t += TAIL
            c += 1
    tables = {"visit_q": np.zeros(n_vis), "chain_offsets": offsets, "worker_offsets": workers}
    return np.mod(st, 2**32).astype(np.uint32).view(np.int32), tables


@pytest.mark.parametrize("start", [1000, 2**32 - 500], ids=["plain", "clock-wraps"])
def test_phase_medians_are_the_planted_cycles(start):
    stamps, tables = synthetic([[3, 2], [4]], start)
    ghz = 1.0
    span = max(3 * sum(PHASE) + 2 * sum(PHASE) + 2 * (KV + EPILOGUE + TAIL) - TAIL,
               4 * sum(PHASE) + KV + EPILOGUE)
    out = probe.analyse(stamps, tables, kernel_us=span / ghz / 1e3, deterministic=True)
    us = 1e-3  # one cycle at 1 GHz
    assert out["clock_ghz"] == pytest.approx(ghz)
    for (name, _), dt in zip(probe.PHASES.items(), PHASE):
        assert out[f"visit: {name}"] == pytest.approx(dt * us)
    assert out["visit_period_us"] == pytest.approx(sum(PHASE) * us)
    assert out["chain: wait K/V"] == pytest.approx(KV * us)
    assert out["chain: dK/dV epilogue"] == pytest.approx(EPILOGUE * us)
    # last visit end -> epilogue -> tail -> next chain's K/V wait -> first visit's Q/dO
    bubble = EPILOGUE + TAIL + KV + PHASE[0]
    assert out["chain: bubble (last visit end -> next visit data ready)"] == \
        pytest.approx(bubble * us)
    assert out["dq writer: staged -> turn"] == pytest.approx(3 * us)
    assert out["dq writer: add latency"] == pytest.approx(5 * us)
