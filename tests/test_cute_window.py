"""The CuTe kernels' sliding window on the CPU: the rule in tile-local coordinates
(:mod:`dash_cuda.backends.cute.mask`) and the forward's walk over KV tiles, held to
:class:`dash_ref.Mask` (the one rule) and :class:`dash_ref.Problem` (its active tiles).

The kernels evaluate these functions on DSL values while they are traced; here they run on
Python ints and boolean tensors (the kernel methods through ``__wrapped__``, the plain
function ``cute.jit`` wraps), so every tile of many shapes is checked. The GPU tests
(``tests/gpu/test_cuda_cute_window.py``) hold the compiled kernels to ``dash_ref`` bit for bit.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("cutlass")

from dash_cuda.backends import Case, choose_backend, get_backend  # noqa: E402
from dash_cuda.backends.cute import mask as rule  # noqa: E402
from dash_cuda.backends.cute.config import (  # noqa: E402
    HEAD_DIMS,
    backward_config,
    forward_config,
    forward_configs,
    tiling_mask,
)
from dash_cuda.backends.cute.fwd_kernel import DashForwardSm90  # noqa: E402
from dash_cuda.backends.cute.variants import (  # noqa: E402
    DTYPES,
    ForwardVariant,
    shipped_variants,
)
from dash_ref import Mask, Problem  # noqa: E402

WINDOWS = [(256, 0), (64, 64), (0, 0), (-1, 32), (100, -1), (5, 3), (0, 300), (1000, 0),
           (130, 1)]
MASKS = [Mask("full"), Mask("causal")] + [Mask("window", *w) for w in WINDOWS]
# (S_q, S_k): tile multiples, ragged, S_q > S_k (rows above the window), a single row
LENGTHS = [(256, 256), (300, 450), (450, 200), (1, 77), (200, 1), (129, 640)]
TILES = [(64, 128), (128, 128), (192, 128)]  # (query rows, keys) of the kernels' tiles


def extents_of(m: Mask, seqlen_q: int, seqlen_k: int):
    return rule.extents(m, seqlen_q, seqlen_k) if m.kind == "window" else None


def cases():
    return itertools.product(MASKS, LENGTHS, TILES)


def case_id(m, lengths, tiles):
    return f"{m.kind}{m.window_size}-{lengths}-{tiles}"


def grid(seqlen: int, block: int):
    return range(-(-seqlen // block))


def truth(m: Mask, i: int, j: int, bm: int, bn: int, seqlen_q: int, seqlen_k: int):
    """The rule on the tile's real rows (``(bm, bn)``, rows past S_q invisible)."""
    rows = range(i * bm, min((i + 1) * bm, seqlen_q))
    seen = torch.zeros(bm, bn, dtype=torch.bool)
    seen[:len(rows)] = m.visible(rows, range(j * bn, (j + 1) * bn), seqlen_q, seqlen_k)
    return seen


@pytest.mark.parametrize("m, lengths, tiles", list(cases()),
                         ids=[case_id(*c) for c in cases()])
def test_the_local_rule_is_mask_keys_in_both_kernels_coordinates(m, lengths, tiles):
    """``visible`` in the forward's (query, key) and the backward's (key, query) coordinates,
    with the kernels' bounds, equals :meth:`Mask.visible` on every tile's real rows."""
    (sq, sk), (bm, bn) = lengths, tiles
    window = extents_of(m, sq, sk)
    query, key = torch.arange(bm)[:, None], torch.arange(bn)[None, :]
    for i, j in itertools.product(grid(sq, bm), grid(sk, bn)):
        want = truth(m, i, j, bm, bn, sq, sk)
        keys_left, diagonal = sk - j * bn, i * bm + sk - sq - j * bn
        fwd = rule.visible(m.kind, key, query, keys_left, diagonal, window=window)
        fwd = fwd.expand(bm, bn)  # a full mask compares keys only
        real = torch.arange(bm) < sq - i * bm  # the forward's stores clip the other rows
        assert torch.equal(fwd[real], want[real]), (i, j)
        bwd = rule.visible(m.kind, key.T, query.T, keys_left, diagonal, sq - i * bm, window)
        assert torch.equal(bwd.expand(bn, bm), want.T), (i, j)


@pytest.mark.parametrize("m, lengths, tiles", list(cases()),
                         ids=[case_id(*c) for c in cases()])
def test_needs_mask_is_exactly_the_tiles_with_an_invisible_element(m, lengths, tiles):
    """The backward's test (with ``rows_left``) is exact; the forward's (the tile's nominal
    rows) is exact on tiles inside S_q and never false where a real element is hidden."""
    (sq, sk), (bm, bn) = lengths, tiles
    window = extents_of(m, sq, sk)
    for i, j in itertools.product(grid(sq, bm), grid(sk, bn)):
        seen = truth(m, i, j, bm, bn, sq, sk)
        hidden = not bool(seen.all())
        keys_left, diagonal = sk - j * bn, i * bm + sk - sq - j * bn
        assert bool(rule.needs_mask(m.kind, keys_left, diagonal, bn, sq - i * bm, bm,
                                    window)) == hidden, (i, j)
        fwd = bool(rule.needs_mask(m.kind, keys_left, diagonal, bn, block_m=bm,
                                   window=window))
        if m.kind == "window":  # the forward asks with the tile's height
            if (i + 1) * bm <= sq:
                assert fwd == hidden, (i, j)
            assert fwd or bool(seen[:sq - i * bm].all()), (i, j)


def forward_kernel(block_m: int) -> DashForwardSm90:
    config = forward_config(64 if block_m == 192 else 128, "full", 1 << 20, block_m=block_m)
    return DashForwardSm90(DTYPES[torch.bfloat16], 64 if block_m == 192 else 128,
                           mask="window", config=config)


WINDOW_CASES = [c for c in cases() if c[0].kind == "window" and c[2][0] != 64]


def check_walk(m: Mask, sq: int, sk: int, bm: int, bn: int = 128) -> None:
    """Per Q tile: the loader's and the math warps' range ``[lo, hi)`` is the Q tile's
    active KV tiles (``Problem.tile_cols`` at the kernel's tiles), or KV tile 0 alone where
    it has none; the unmasked loop runs exactly the tiles after the first for which
    :meth:`ragged` is false (and those see every key), the masked loops the others, each
    tile once, ascending."""
    k = forward_kernel(bm)
    window = rule.extents(m, sq, sk)
    p = Problem(1, 1, 1, sq, sk, 128, block_m=bm, block_n=bn, window_size=m.window_size)
    kv_tiles = DashForwardSm90.window_kv_tiles.__wrapped__
    unmasked = DashForwardSm90.window_unmasked_kv_tiles.__wrapped__
    ragged = DashForwardSm90.ragged.__wrapped__
    for i in range(p.n_q):
        lo, hi = kv_tiles(k, i, sq, sk, window)
        active = p.tile_cols[i]
        assert (lo, hi) == ((active[0], active[-1] + 1) if active else (0, 1)), i
        assert not active or tuple(range(lo, hi)) == active  # contiguous
        u_lo, u_hi = unmasked(k, i, lo, hi, sq, sk, window)
        assert lo + 1 <= u_lo <= u_hi <= hi or (lo + 1 == hi and u_lo == u_hi == hi), i
        walked = [lo, *range(lo + 1, u_lo), *range(u_lo, u_hi), *range(u_hi, hi)]
        assert walked == list(range(lo, hi))
        diagonal = i * bm + sk - sq
        for j in range(lo, hi):
            needs = bool(ragged(k, sk - j * bn, diagonal - j * bn, window))
            seen = truth(m, i, j, bm, bn, sq, sk)[:len(p.rows(i))]
            assert needs or bool(seen.all()), (i, j)  # never too narrow
            if (i + 1) * bm <= sq:
                assert needs == (not bool(seen.all())), (i, j)  # exact inside S_q
            if j > lo:
                assert needs == (not u_lo <= j < u_hi), (i, j)


@pytest.mark.parametrize("m, lengths, tiles", WINDOW_CASES,
                         ids=[case_id(*c) for c in WINDOW_CASES])
def test_the_forward_walks_the_active_kv_tiles_with_the_mask_where_one_is_needed(m, lengths,
                                                                               tiles):
    check_walk(m, *lengths, *tiles)


@pytest.mark.parametrize("window", WINDOWS, ids=str)
def test_the_forward_walk_holds_at_every_offset_of_the_diagonal(window):
    """:func:`check_walk` for ``S_k - S_q`` over a whole KV tile of offsets: every residue
    of a window's edges modulo the tile, where an off-by-one would show."""
    m = Mask("window", *window)
    for sk, bm in itertools.product(range(250, 250 + 129), (128, 192)):
        check_walk(m, 260, sk, bm)


def test_extents_write_an_unbounded_side_as_one_that_hides_no_key():
    assert rule.extents(Mask("window", 5, 3), 100, 200) == (5, 3)
    assert rule.extents(Mask("window", -1, 3), 100, 200) == (300, 3)
    assert rule.extents(Mask("window", 7, -1), 100, 200) == (7, 300)
    assert rule.extents(Mask("window", 10**12, 0), 100, 200) == (300, 0)  # fits an Int32
    for m in (Mask("full"), Mask("causal")):
        with pytest.raises(ValueError, match="'window' mask"):
            rule.extents(m, 1, 1)


def test_window_arguments_come_from_the_mask():
    from dash_cuda.backends.cute.launch import window_args

    assert window_args(Mask("window", -1, 32), 100, 20) == {"window_left": 120,
                                                            "window_right": 32}
    assert window_args(Mask("window", 4, 32), 10, 20) == {"window_left": 4,
                                                          "window_right": 30}
    assert window_args(Mask("causal"), 10, 20) == {"window_left": 0, "window_right": 0}


def test_window_variants_are_shipped_for_every_dtype_head_dim_and_flag():
    """Forward at every tile height its tiling picks, the backward deterministic and atomic
    with each dK/dV form; one backward configuration (causal's) serves every window."""
    shipped = shipped_variants()
    windows = [v for v in shipped if v.mask == "window"]
    fwd = [v for v in windows if isinstance(v, ForwardVariant)]
    bwd = [v for v in windows if not isinstance(v, ForwardVariant)]
    assert all("_window_" in v.name for v in windows)
    # dtypes, (head dim, value head dim) pairs, deterministic or atomic, three dK/dV forms;
    # rectangular and packed; without and, at the softcap's head dims, with a softcap
    from dash_cuda.backends.cute.config import SOFTCAP_HEAD_DIMS, value_head_dims

    per_dims = 2 * 2 * 3 * 2
    dims = [(d, dv) for d in HEAD_DIMS for dv in value_head_dims(d)]
    capped = [(d, dv) for d, dv in dims if d in SOFTCAP_HEAD_DIMS]
    assert len(bwd) == per_dims * (len(dims) + len(capped))
    assert {(v.head_dim, v.head_dim_v) for v in bwd} == set(dims)
    assert sum(v.packed for v in bwd) == len(bwd) // 2
    assert all(v.head_dim in SOFTCAP_HEAD_DIMS for v in bwd if v.softcap)
    assert {(v.dtype, v.head_dim, v.deterministic, v.audit, v.per_head) for v in bwd} == {
        (v.dtype, v.head_dim, v.deterministic, v.audit, v.per_head)
        for v in shipped if getattr(v, "mask", None) == "causal" and v not in fwd
        and not isinstance(v, ForwardVariant)}
    for d, dv in dims:
        assert backward_config(d, "window") == backward_config(d, "causal")
        assert set(forward_configs(d, "window", dv)) == (set(forward_configs(d, "full", dv))
                                                       | set(forward_configs(d, "causal", dv)))
        assert {v.config for v in fwd if (v.head_dim, v.head_dim_v) == (d, dv)} == set(
            forward_configs(d, "window", dv))


@pytest.mark.parametrize("window, tiling", [((256, 0), "causal"), ((64, 64), "full"),
                                            ((-1, 32), "full"), ((100, -1), "full")])
def test_a_window_tiles_as_the_mask_its_right_side_makes_it(window, tiling):
    m = Mask("window", *window)
    assert tiling_mask(m) == tiling == Problem(1, 1, 1, 8, 8, 64, window_size=window).mask
    for s in (100, 5000):
        assert forward_config(64, tiling_mask(m), s) == forward_config(64, tiling, s)


def test_auto_picks_cute_for_windows():
    if get_backend("cute").missing():
        pytest.skip("CuTe DSL is not installed here")
    case = Case(64, torch.bfloat16, exact=False, deterministic=True, window=True)
    assert get_backend("cute").unsupported(case) is None
    assert choose_backend("auto", case).name == "cute"
    import dash_cuda.backends.cute as cute_backend

    packed = Case(64, torch.bfloat16, exact=False, deterministic=True, packed=True, window=True)
    # packed windows too, while the packed switch is on
    want = "cute" if cute_backend.PACKED_BACKWARD else "triton"
    assert choose_backend("auto", packed).name == want
