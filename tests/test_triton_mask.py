"""The Triton kernels' visibility rule (``backends/triton/mask.py``) is ``dash_ref.Mask``'s.

``visible`` and ``key_range`` run in Triton's interpreter (``TRITON_INTERPRET=1``, in a
fresh process: the flag counts when the kernels are defined) on tile grids of several
shapes, in both orientations the kernels use, and are compared with
:class:`dash_ref.Mask` element by element: with the row bound as the backward asks it,
without it as the forward does (its rows past ``S_q`` are never stored), and the forward's
key range of every Q tile against the first and last rows' visible keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

from dash_ref import Mask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# (S_q, S_k, BM, BN): square, S_q < S_k, S_q > S_k (causal rows that see no key), one row,
# lengths not multiples of the tiles, BM < BN and BM > BN
CASES = [(64, 64, 32, 16), (50, 77, 16, 32), (90, 40, 32, 16), (1, 45, 16, 16),
         (37, 37, 16, 32), (20, 100, 32, 32), (100, 20, 16, 16)]

INTERPRETED = """
import sys, torch, triton, triton.language as tl
from dash_cuda.backends.triton.mask import key_range, visible

@triton.jit
def probe(ROW_MAJOR, TRANSPOSED, UNBOUNDED, RANGES, S_Q, S_K, CAUSAL_OFFSET, N_COLS,
          BM: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr):
    i = tl.program_id(0)
    j = tl.program_id(1)
    rows = i * BM + tl.arange(0, BM)
    cols = j * BN + tl.arange(0, BN)
    at = rows[:, None] * N_COLS + cols[None, :]
    seen = visible(rows[:, None], cols[None, :], S_Q, S_K, CAUSAL_OFFSET, MASK)
    tl.store(ROW_MAJOR + at, seen.to(tl.int32))
    seen_t = visible(rows[None, :], cols[:, None], S_Q, S_K, CAUSAL_OFFSET, MASK)
    tl.store(TRANSPOSED + rows[None, :] * N_COLS + cols[:, None], seen_t.to(tl.int32))
    unbounded = visible(rows[:, None], cols[None, :], None, S_K, CAUSAL_OFFSET, MASK)
    tl.store(UNBOUNDED + at, unbounded.to(tl.int32))
    if j == 0:
        dense, hi = key_range(i, S_K, CAUSAL_OFFSET, BM, BN, MASK)
        tl.store(RANGES + 2 * i, dense)
        tl.store(RANGES + 2 * i + 1, hi)

cases = torch.load(sys.argv[1])
for c in cases:
    s_q, s_k, bm, bn = c["shape"]
    n_q, n_kv = -(-s_q // bm), -(-s_k // bn)
    out = {k: torch.full((n_q * bm, n_kv * bn), -1, dtype=torch.int32)
           for k in ("row_major", "transposed", "unbounded")}
    ranges = torch.full((n_q, 2), -1, dtype=torch.int32)
    probe[(n_q, n_kv)](out["row_major"], out["transposed"], out["unbounded"], ranges,
                       s_q, s_k, s_k - s_q, n_kv * bn, BM=bm, BN=bn, MASK=c["mask"])
    c.update(out, ranges=ranges)
torch.save(cases, sys.argv[1])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> list[dict]:
    cases = [dict(shape=shape, mask=mask) for shape in CASES for mask in ("full", "causal")]
    path = tmp_path_factory.mktemp("triton_mask") / "cases.pt"
    torch.save(cases, path)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED, str(path)], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return torch.load(path)


def ids(case) -> str:
    return f"{case[1]}-Sq{case[0][0]}-Sk{case[0][1]}-BM{case[0][2]}-BN{case[0][3]}"


ALL = [(shape, mask) for shape in CASES for mask in ("full", "causal")]


@pytest.mark.parametrize("index", range(len(ALL)), ids=[ids(c) for c in ALL])
def test_visible_is_the_cpu_rule_in_both_orientations(interpreted, index):
    """Every element of the padded tile grid: ``Mask.visible`` and ``r < S_q`` (the
    backward's call, both orientations); without the row bound, ``Mask.visible`` on every
    row, also past ``S_q`` (the forward's call)."""
    c = interpreted[index]
    s_q, s_k, _, _ = c["shape"]
    n_rows, n_cols = c["row_major"].shape
    rule = Mask(c["mask"]).visible(range(n_rows), range(n_cols), s_q, s_k)
    in_rows = (torch.arange(n_rows) < s_q)[:, None]
    assert torch.equal(c["row_major"].bool(), rule & in_rows)
    assert torch.equal(c["transposed"].bool(), rule & in_rows)
    assert torch.equal(c["unbounded"].bool(), rule)
    assert rule[:s_q].any() or c["mask"] == "causal"  # the cases are not vacuous


@pytest.mark.parametrize("index", range(len(ALL)), ids=[ids(c) for c in ALL])
def test_key_range_is_the_tiles_first_and_last_rows_keys(interpreted, index):
    """Q tile ``i`` walks keys ``[0, hi)``, ``hi`` the last row's last visible key + 1 (so
    every key a row of the tile sees, none more), and needs no element mask below
    ``dense``: the first row's visible keys rounded down to whole KV tiles."""
    c = interpreted[index]
    s_q, s_k, bm, bn = c["shape"]
    mask = Mask(c["mask"])
    for i, (dense, hi) in enumerate(c["ranges"].tolist()):
        first, last = i * bm, (i + 1) * bm - 1
        assert hi == mask.keys(last, s_q, s_k).stop
        assert dense == mask.keys(first, s_q, s_k).stop // bn * bn
        seen = mask.visible(range(first, last + 1), range(s_k), s_q, s_k)
        assert not seen[:, hi:].any()
        assert seen[:, :dense].all()
