"""The one visibility rule: a Mask says which keys each query row sees, and every CPU
component (the tiles, the emulator, the float64 and mpmath references) asks it."""

from __future__ import annotations

import itertools

import pytest
import torch

from dash_ref import Mask, Problem
from dash_ref.emulate import visible
from verify.highprec import _visible
from verify.reference import causal_mask

SHAPES = [(5, 5), (3, 8), (8, 3), (1, 1), (7, 0), (0, 4)]


@pytest.mark.parametrize("s_q, s_k", SHAPES)
def test_causal_is_bottom_right_aligned_and_full_sees_every_key(s_q, s_k):
    causal, full = Mask("causal"), Mask("full")
    for r in range(s_q):
        assert list(causal.keys(r, s_q, s_k)) == [c for c in range(s_k) if c <= r + s_k - s_q]
        assert list(full.keys(r, s_q, s_k)) == list(range(s_k))


@pytest.mark.parametrize("kind", ["full", "causal"])
@pytest.mark.parametrize("s_q, s_k", SHAPES)
def test_every_view_of_the_rule_agrees_with_keys(kind, s_q, s_k):
    m = Mask(kind)
    grid = m.visible(range(s_q), range(s_k), s_q, s_k)
    want = torch.tensor([[c in m.keys(r, s_q, s_k) for c in range(s_k)] for r in range(s_q)],
                        dtype=torch.bool).reshape(s_q, s_k)
    assert torch.equal(grid, want)
    for r0, r1, c0, c1 in [
            (0, s_q, 0, s_k), (s_q // 2, s_q, 0, s_k // 2 + 1), (0, min(1, s_q), s_k // 2, s_k)]:
        block = want[r0:r1, c0:c1]
        assert m.unmasked(range(r0, r1), range(c0, c1), s_q, s_k) == int(block.sum())
        assert m.any_visible(range(r0, r1), range(c0, c1), s_q, s_k) == bool(block.any())
    if kind == "causal":
        assert torch.equal(causal_mask(s_q, s_k), want)
    assert [list(k) for k in _visible(kind == "causal", s_q, s_k)] == [
        [c for c in range(s_k) if want[r, c]] for r in range(s_q)]


def test_the_problem_and_the_emulator_ask_the_mask():
    p = Problem(1, 1, 1, 70, 100, 16, "causal", 32, 32)
    assert p.visibility == Mask("causal")
    for i, j in itertools.product(range(p.n_q), range(p.n_kv)):
        tile = visible(p, p.rows(i), p.cols(j))
        assert p.active(i, j) == bool(tile.any())
        assert p.unmasked(i, j) == int(tile.sum())


def test_a_bad_kind_is_refused():
    with pytest.raises(ValueError, match="mask must be one of"):
        Mask("sliding")
