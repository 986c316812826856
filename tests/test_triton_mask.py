"""The Triton kernels' visibility rule (``backends/triton/mask.py``) is ``dash_ref.Mask``'s.

``visible`` and ``key_range`` run in Triton's interpreter (``TRITON_INTERPRET=1``, in a
fresh process: the flag counts when the kernels are defined) on tile grids of several
shapes, in both orientations the kernels use, and are compared with
:class:`dash_ref.Mask` element by element: with the row bound as the backward asks it,
without it as the forward does (its rows past ``S_q`` are never stored), and the forward's
key range of every Q tile against the first and last rows' visible keys. Every kind: full,
causal, and sliding windows whose extents are runtime arguments (one-sided, two-sided,
asymmetric, zero-width, unbounded on one side, wider than the keys), so a window side that
is off by one key, or a range end rounded the wrong way, changes some element.
"""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import run_source

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

from dash_ref import Mask  # noqa: E402

# (S_q, S_k, BM, BN): square, S_q < S_k, S_q > S_k (causal rows that see no key), one row,
# lengths not multiples of the tiles, BM < BN and BM > BN
CASES = [(64, 64, 32, 16), (50, 77, 16, 32), (90, 40, 32, 16), (1, 45, 16, 16),
         (37, 37, 16, 32), (20, 100, 32, 32), (100, 20, 16, 16)]
# (left, right): one-sided (a causal sliding window, and its mirror), two-sided, asymmetric,
# zero-width (the diagonal alone), unbounded on one side, wider than every grid
WINDOWS = [(3, 0), (1, 0), (0, 5), (7, 7), (9, 2), (12, 3), (17, 2), (0, 0), (-1, 4), (6, -1),
           (200, 150)]
MASKS = [("full", -1, -1), ("causal", -1, -1), *(("window", *w) for w in WINDOWS)]
ALL = [(shape, mask) for shape in CASES for mask in MASKS]

INTERPRETED = """
import sys, torch, triton, triton.language as tl
from dash_cuda.backends.triton.mask import key_range, visible

@triton.jit
def probe(ROW_MAJOR, TRANSPOSED, UNBOUNDED, RANGES, S_Q, S_K, CAUSAL_OFFSET, N_COLS,
          LEFT, RIGHT, BM: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr):
    i = tl.program_id(0)
    j = tl.program_id(1)
    rows = i * BM + tl.arange(0, BM)
    cols = j * BN + tl.arange(0, BN)
    at = rows[:, None] * N_COLS + cols[None, :]
    seen = visible(rows[:, None], cols[None, :], S_Q, S_K, CAUSAL_OFFSET, LEFT, RIGHT, MASK)
    tl.store(ROW_MAJOR + at, seen.to(tl.int32))
    seen_t = visible(rows[None, :], cols[:, None], S_Q, S_K, CAUSAL_OFFSET, LEFT, RIGHT, MASK)
    tl.store(TRANSPOSED + rows[None, :] * N_COLS + cols[:, None], seen_t.to(tl.int32))
    unbounded = visible(rows[:, None], cols[None, :], None, S_K, CAUSAL_OFFSET, LEFT, RIGHT,
                        MASK)
    tl.store(UNBOUNDED + at, unbounded.to(tl.int32))
    if j == 0:
        lo, dense_lo, dense_hi, hi = key_range(i, S_K, CAUSAL_OFFSET, LEFT, RIGHT, BM, BN,
                                               MASK)
        tl.store(RANGES + 4 * i, lo)
        tl.store(RANGES + 4 * i + 1, dense_lo)
        tl.store(RANGES + 4 * i + 2, dense_hi)
        tl.store(RANGES + 4 * i + 3, hi)

cases = torch.load(sys.argv[1])
for c in cases:
    s_q, s_k, bm, bn = c["shape"]
    n_q, n_kv = -(-s_q // bm), -(-s_k // bn)
    out = {k: torch.full((n_q * bm, n_kv * bn), -1, dtype=torch.int32)
           for k in ("row_major", "transposed", "unbounded")}
    ranges = torch.full((n_q, 4), -1, dtype=torch.int32)
    kind, left, right = c["mask"]
    if kind != "window":  # the kernels' extents of the other kinds: None
        left = right = None
    probe[(n_q, n_kv)](out["row_major"], out["transposed"], out["unbounded"], ranges,
                       s_q, s_k, s_k - s_q, n_kv * bn, left, right, BM=bm, BN=bn, MASK=kind)
    c.update(out, ranges=ranges)
torch.save(cases, sys.argv[1])
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> list[dict]:
    cases = [dict(shape=shape, mask=mask) for shape, mask in ALL]
    return run_source(INTERPRETED, cases, tmp_path_factory.mktemp("triton_mask") / "cases.pt")


def ids(case) -> str:
    kind, left, right = case[1]
    name = f"window{left},{right}" if kind == "window" else kind
    return f"{name}-Sq{case[0][0]}-Sk{case[0][1]}-BM{case[0][2]}-BN{case[0][3]}"


@pytest.mark.parametrize("index", range(len(ALL)), ids=[ids(c) for c in ALL])
def test_visible_is_the_cpu_rule_in_both_orientations(interpreted, index):
    """Every element of the padded tile grid: ``Mask.visible`` and ``r < S_q`` (the
    backward's call, both orientations); without the row bound, ``Mask.visible`` on every
    row, also past ``S_q`` (the forward's call)."""
    c = interpreted[index]
    s_q, s_k, _, _ = c["shape"]
    n_rows, n_cols = c["row_major"].shape
    rule = Mask(*c["mask"]).visible(range(n_rows), range(n_cols), s_q, s_k)
    in_rows = (torch.arange(n_rows) < s_q)[:, None]
    assert torch.equal(c["row_major"].bool(), rule & in_rows)
    assert torch.equal(c["transposed"].bool(), rule & in_rows)
    assert torch.equal(c["unbounded"].bool(), rule)
    assert rule[:s_q].any() or c["mask"][0] == "causal"  # the cases are not vacuous


def test_the_windows_hide_keys_the_full_mask_shows():
    """Not vacuous: every window but the widest hides keys on most grids (so a side off by
    one key changes elements), the widest hides none (the full mask's elements)."""
    for left, right in WINDOWS:
        hidden = [not Mask("window", left, right).visible(range(s_q), range(s_k), s_q, s_k)
                  .all() for s_q, s_k, _, _ in CASES]
        if (left, right) == (200, 150):
            assert not any(hidden)
        else:
            assert sum(hidden) >= len(CASES) - 1, (left, right)


@pytest.mark.parametrize("index", range(len(ALL)), ids=[ids(c) for c in ALL])
def test_key_range_is_the_tiles_first_and_last_rows_keys(interpreted, index):
    """Q tile ``i`` walks ``[lo, dense_lo)`` masked, ``[dense_lo, dense_hi)`` unmasked,
    ``[dense_hi, hi)`` masked, in whole ``BN``-key tiles from ``BN``-aligned starts, each
    key once, in ascending order: ``lo`` the first row's first visible key rounded down to
    a tile, ``hi`` the last row's last visible key + 1 (so every key a row of the tile sees,
    and no tile that no row sees); the unmasked tiles are exactly the whole tiles that every
    row sees."""
    c = interpreted[index]
    s_q, s_k, bm, bn = c["shape"]
    mask = Mask(*c["mask"])
    for i, (lo, dense_lo, dense_hi, hi) in enumerate(c["ranges"].tolist()):
        first, last = i * bm, (i + 1) * bm - 1
        assert lo == mask.keys(first, s_q, s_k).start // bn * bn
        assert hi == mask.keys(last, s_q, s_k).stop
        assert lo <= dense_lo <= dense_hi <= hi
        if mask.kind != "window":  # these kinds start at key 0, as before windows
            assert lo == dense_lo == 0
        masked = [*range(lo, dense_lo, bn), *range(dense_hi, hi, bn)]
        dense = list(range(dense_lo, dense_hi, bn))
        starts = sorted(masked + dense)
        assert all(t % bn == 0 for t in starts)
        assert len(set(starts)) == len(starts)  # no tile twice
        seen = mask.visible(range(first, last + 1), range(s_k), s_q, s_k)
        walked = torch.zeros(s_k, dtype=torch.bool)
        for t in starts:
            walked[t:t + bn] = True
        assert not (seen.any(0) & ~walked).any()  # every key some row sees
        assert all(seen[:, t:t + bn].any() for t in starts)  # no tile that no row sees
        whole = [t for t in range(0, s_k - bn + 1, bn) if seen[:, t:t + bn].all()]
        assert dense == whole
