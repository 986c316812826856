"""Host side of the CuTe backend's packed (varlen) forward, on any machine.

The launch arguments that describe a packed batch, the tile list restated in Python (every
sequence gets the longest one's Q tiles; the loader skips those past its sequence's end:
what runs is exactly each sequence's own tiles), the packed variants' names and shipping,
and the refusal of packed calls that stays until a packed backward exists.
"""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("cutlass")

from dash_cuda.backends import Case  # noqa: E402
from dash_cuda.backends.cute import BACKEND, arguments, fwd_kernel  # noqa: E402
from dash_cuda.backends.cute import launch as cute_launch  # noqa: E402
from dash_cuda.backends.cute import mask as cute_mask  # noqa: E402
from dash_cuda.backends.cute.variants import ForwardVariant, shipped_variants  # noqa: E402
from dash_cuda.options import Packing  # noqa: E402
from dash_ref import Mask, Problem  # noqa: E402

SEQLENS_Q = (1, 0, 700, 3, 511, 0, 257)
SEQLENS_K = (1, 7, 900, 3, 300, 0, 0)


def packing(seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K) -> Packing:
    def offsets(lengths):
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)

    return Packing.read(offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q),
                        max(seqlens_k), sum(seqlens_q), sum(seqlens_k))


def test_the_packed_launch_names_every_forward_argument():
    """The batch's arguments and the ones run_forward_varlen adds are the entry's, once."""
    args = cute_launch.forward_varlen_args(packing(), 4, sum(SEQLENS_Q), sum(SEQLENS_K),
                                           Mask("causal"), tiles=100, sms=132)
    rest = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "counter_ptr",
                          "heads_kv", "q_strides", "k_strides", "v_strides", "o_strides",
                          "scale_log2", "stream"), 0)
    assert set(args).isdisjoint(rest)
    arguments.values(arguments.names(fwd_kernel.LAUNCH_ARGS), {**args, **rest})  # complete
    assert args["seqlen_q"] == sum(SEQLENS_Q) and args["seqlen_k"] == sum(SEQLENS_K)
    assert args["batch"] == len(SEQLENS_Q) and args["max_seqlen_q"] == max(SEQLENS_Q)
    assert args["num_ctas"] == 100 and args["dynamic"] == 0
    assert cute_launch.forward_varlen_args(packing(), 4, 1, 1, Mask("full"), tiles=1000,
                                           sms=132)["num_ctas"] == 132


@pytest.mark.parametrize("window", [(0, 0), (-1, 32), (100, -1), (64, 64)])
def test_a_packed_window_hides_exactly_the_rules_keys_in_every_sequence(window):
    """The extents come from the longest lengths; for every sequence the kernel's rule
    (:func:`.mask.visible` on its own lengths) is the window's, so an unbounded side hides
    no key of any sequence."""
    rule = Mask.of(False, window)
    assert rule.kind == "window"
    args = cute_launch.forward_varlen_args(packing(), 1, 1, 1, rule, tiles=1, sms=1)
    extents = (args["window_left"], args["window_right"])
    for sq, sk in zip(SEQLENS_Q, SEQLENS_K):
        for r in range(0, sq, 37):
            seen = [c for c in range(sk) if cute_mask.visible(
                "window", c, r, sk, sk - sq, window=extents)]
            assert seen == list(rule.keys(r, sq, sk)), (sq, sk, r)


def kernel_tiles(p: Problem, block_m: int, max_seqlen_q: int, causal: bool):
    """The packed forward's tile list restated: ``tile_coords`` over the longest sequence's
    tiles, less the tiles the loader skips (``i * BM >= S_q(b)``)."""
    n_q = -(-max_seqlen_q // block_m)
    bh_count = p.batch * p.heads
    heads, l2 = p.heads, p.heads  # packed launches: one section of every head
    out = []
    for t in range(bh_count * n_q):
        if causal:
            section = t // (l2 * n_q)
            first = section * l2
            width = min(l2, bh_count - first)
            r = t - first * n_q
            i, bh = n_q - 1 - r // width, first + r % width
        else:
            i, bh = t % n_q, t // n_q
        b, h = divmod(bh, heads)
        if i * block_m < p.seqlen_q_of(b):
            out.append((b, h, i))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m", [128, 192])
def test_the_tiles_that_run_are_each_sequences_own(causal, block_m):
    p = Problem.packed(SEQLENS_Q, SEQLENS_K, 3, 1, 64, "causal" if causal else "full",
                       block_m, 128)
    ran = kernel_tiles(p, block_m, max(SEQLENS_Q), causal)
    assert len(ran) == len(set(ran))
    assert set(ran) == {(b, h, i) for b in range(p.batch) for h in range(3)
                        for i in range(p.n_q_of(b))}
    # a larger max_seqlen (the call's) runs the same tiles
    assert set(kernel_tiles(p, block_m, max(SEQLENS_Q) + 500, causal)) == set(ran)


def test_every_forward_has_a_shipped_packed_twin():
    shipped = shipped_variants()
    forwards = [v for v in shipped if isinstance(v, ForwardVariant)]
    plain = {v for v in forwards if not v.packed}
    packed = {v for v in forwards if v.packed}
    assert {ForwardVariant(v.dtype, v.head_dim, v.mask, v.config, True) for v in plain} == packed
    assert all("_varlen_" in v.name for v in packed)
    assert not any("varlen" in v.name for v in plain)


def test_a_packed_call_picks_its_packed_forward():
    rule = Mask("causal")
    v = cute_launch.forward_variant(torch.bfloat16, 64, rule, 700, packed=True)
    assert v.packed and v in shipped_variants()
    assert v.config == cute_launch.forward_variant(torch.bfloat16, 64, rule, 700).config


def test_packed_calls_are_refused_until_a_packed_backward_exists():
    reason = BACKEND.unsupported(Case(64, torch.bfloat16, False, True, packed=True))
    assert reason is not None and "packed backward" in reason
    assert BACKEND.unsupported(Case(64, torch.bfloat16, False, True)) is None
    assert callable(BACKEND.forward_varlen)
