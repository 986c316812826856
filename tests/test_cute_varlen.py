"""Host side of the CuTe backend's packed (varlen) kernels, on any machine.

The launch arguments that describe a packed batch, the tile list restated in Python (every
sequence gets the longest one's Q tiles; the loader skips those past its sequence's end:
what runs is exactly each sequence's own tiles), the packed variants' names and shipping,
the one switch for packed calls (``PACKED_BACKWARD``), and the packed backward's host side
(its launch arguments, the kernel's dQ tile numbers, the tile table that places them,
the audit's dQacc read back); ``tests/test_packed_rows.py`` runs the kernels that use the
table.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

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
                          "scale_log2", "softcap_k", "softcap", "sink2_ptr", "stream"), 0)
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
    assert {replace(v, packed=True) for v in plain} == packed
    assert all("_varlen_" in v.name for v in packed)
    assert not any("varlen" in v.name for v in plain)


def test_a_packed_call_picks_its_packed_forward():
    rule = Mask("causal")
    v = cute_launch.forward_variant(torch.bfloat16, 64, rule, 700, packed=True)
    assert v.packed and v in shipped_variants()
    assert v.config == cute_launch.forward_variant(torch.bfloat16, 64, rule, 700).config


def test_packed_calls_follow_the_one_switch(monkeypatch):
    """PACKED_BACKWARD is the one switch: on, packed calls run here (forward and backward);
    off, they are refused with the reason, and ``backend="auto"`` runs them on Triton."""
    import dash_cuda.backends.cute as cute_backend

    case = Case(64, torch.bfloat16, False, True, packed=True)
    monkeypatch.setattr(cute_backend, "PACKED_BACKWARD", False)
    reason = BACKEND.unsupported(case)
    assert reason is not None and "PACKED_BACKWARD" in reason
    monkeypatch.setattr(cute_backend, "PACKED_BACKWARD", True)
    assert BACKEND.unsupported(case) is None
    assert BACKEND.unsupported(Case(64, torch.bfloat16, False, True)) is None
    assert callable(BACKEND.forward_varlen)


# -- the packed backward's host side ------------------------------------------------------------
def packed_problem(heads=3, heads_kv=1, head_dim=64, mask="causal") -> Problem:
    from dash_cuda.launch import packed_problem_for

    return packed_problem_for(BACKEND, SEQLENS_Q, SEQLENS_K, heads, heads_kv, head_dim,
                              Mask(mask))


def test_every_backward_has_a_shipped_packed_twin():
    from dataclasses import replace

    from dash_cuda.backends.cute.variants import Variant

    backwards = [v for v in shipped_variants() if isinstance(v, Variant)]
    plain = {v for v in backwards if not v.packed}
    packed = {v for v in backwards if v.packed}
    assert {replace(v, packed=True) for v in plain} == packed
    assert all("_varlen_" in v.name for v in packed)
    assert not any("varlen" in v.name for v in plain)


def cpu_launch(p: Problem, per_head: bool):
    """A packed Launch on the CPU (pointers only: nothing runs), tables as the call makes."""
    from dash_cuda.backends import Launch
    from dash_cuda.tables import device_schedule

    def t(*shape, dtype=torch.bfloat16):
        return torch.zeros(*shape, dtype=dtype)

    q, k = t(p.total_q, p.heads, p.head_dim), t(p.total_k, p.heads_kv, p.head_dim)
    out_heads = p.heads if per_head else p.heads_kv
    dk = t(p.total_k, out_heads, p.head_dim, dtype=torch.float32 if per_head else q.dtype)
    stats = t(p.heads, p.total_q, dtype=torch.float32).t()
    launch = Launch(p, q, k, k.clone(), q.clone(), stats, stats.clone(),
                    torch.zeros(cute_launch.dq_acc_shape(p)), dk, dk.clone(), 0.125, True, False,
                    per_head, False, 4)
    launch.tables = device_schedule(p, "lpt", 4, q.device).tables
    launch.cu_seqlens_q = torch.tensor(p.cu_seqlens_q, dtype=torch.int32)
    launch.cu_seqlens_k = torch.tensor(p.cu_seqlens_k, dtype=torch.int32)
    return launch


@pytest.mark.parametrize("per_head", [False, True])
def test_the_packed_backward_launch_names_every_argument(per_head):
    """run_schedule's packed arguments and the ones every launch passes are the entry's,
    once; the batch is described by its rows, its sequences and the longest lengths."""
    from dash_cuda.backends.cute import bwd_kernel

    p = packed_problem()
    launch = cpu_launch(p, per_head)
    operands = (launch.q, launch.k, launch.v, launch.do, launch.dk_out, launch.dv_out)
    args = cute_launch._packed_args(p, tuple(map(cute_launch._packed_strides, operands)))
    rest = dict.fromkeys(("heads", "heads_kv", "num_workers", "scale_log2", "softmax_scale",
                          "softcap_k", "softcap", *cute_launch._BACKWARD_PER_CALL,
                          *cute_launch._PACKED_PER_CALL), 0)
    assert set(args).isdisjoint(rest)
    arguments.values(arguments.names(bwd_kernel.LAUNCH_ARGS), {**args, **rest})  # complete
    assert (args["seqlen_q"], args["seqlen_k"]) == (sum(SEQLENS_Q), sum(SEQLENS_K))
    assert args["batch"] == len(SEQLENS_Q) and args["num_q_tiles"] == p.num_q_tiles
    assert args["q_strides"] == (0, *launch.q.stride()[:2])
    assert cute_launch.variant_of(launch).packed
    assert cute_launch.variant_of(launch) in shipped_variants()


def test_the_kernels_tile_numbers_are_the_problems():
    """The kernel's dQ tile (and semaphore, and LSE2/D rows) of visit (b, h, i),
    ``q_tile_base[b] + h * ceil(S_q(b) / BM) + i`` from the uploaded table, is
    ``Problem.q_tile_index``; every tile once."""
    p = packed_problem()
    base = cpu_launch(p, False).tables["q_tile_base"].tolist()
    seen = []
    for b in range(p.batch):
        for h in range(p.heads):
            for i in range(p.n_q_of(b)):
                t = base[b] + h * -(-p.seqlen_q_of(b) // p.block_m) + i
                assert t == p.q_tile_index(b, h, i)
                seen.append(t)
    assert sorted(seen) == list(range(p.num_q_tiles))


def test_the_tile_table_places_every_tile_on_its_sequences_rows():
    """Row ``q_tile_index(b, h, i)`` of the tile table is that tile's first packed row, its
    rows (the last tile of a sequence is partial) and its head; every tile once."""
    from dash_cuda.backends.cute.packed_rows import tile_table

    p = packed_problem()
    table = tile_table(p, torch.device("cpu")).tolist()
    want = [None] * p.num_q_tiles
    for b in range(p.batch):
        for h in range(p.heads):
            for i in range(p.n_q_of(b)):
                rows = min(p.block_m, p.seqlen_q_of(b) - i * p.block_m)
                want[p.q_tile_index(b, h, i)] = [p.cu_seqlens_q[b] + i * p.block_m, rows, h]
    assert table == want


@pytest.mark.parametrize("head_dim", [64, 128])
def test_an_audits_dq_acc_reads_every_packed_row_from_its_tile(head_dim):
    """dq_acc_rows (the audit record's dQacc) reads every packed row back from its tile in
    staging order, through the one tile table."""
    p = packed_problem(head_dim=head_dim)
    bm, H = p.block_m, p.heads
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(p.total_q, H, head_dim, generator=gen)
    row_major = torch.full((p.num_q_tiles, bm, head_dim), float("nan"))
    for b in range(p.batch):
        first, sq = p.cu_seqlens_q[b], p.seqlen_q_of(b)
        for h in range(H):
            for i in range(p.n_q_of(b)):
                t, n = p.q_tile_index(b, h, i), min(bm, sq - i * bm)
                row_major[t, :n] = rows[first + i * bm:first + i * bm + n, h]
    index = cute_launch.staged_index(bm, head_dim, torch.device("cpu")).long()
    staged = torch.empty(p.num_q_tiles, bm * head_dim)
    staged[:, index] = row_major.reshape(p.num_q_tiles, -1)  # tiles_to_rows's inverse
    assert torch.equal(cute_launch.dq_acc_rows(staged, p), rows)
    assert cute_launch.dq_acc_shape(p) == tuple(staged.shape)
