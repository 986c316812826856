"""Hypothesis strategies for attention problems, exported for users.

Draw shapes that break kernels: lengths of 1, lengths that are not a multiple of any tile
size, ``S_q != S_k`` both ways (bottom-right causal rows that see no key), GQA and MQA
head groups, every mask, dtype and schedule, all bounded by a memory budget so a fuzzing
run stays small::

    from hypothesis import given
    from verify.strategies import cases

    @given(cases(max_elements=50_000))
    def test_my_kernel(case):
        q, k, v, do = case.tensors()
        ...

Packed batches (FlashAttention's ``varlen`` layout): :func:`packed_problems` draws
heavy-tailed mixes of lengths (mostly short, now and then long, with empty sequences,
length 1 and lengths off the tile multiples), ``S_q != S_k`` per sequence, GQA and MQA;
:func:`packed_cases` draws a :class:`Case` of one, whose :meth:`Case.tensors` are then
``(total, H, d)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from dash_ref import NAMES, RAGGED, Problem
from dash_ref._checks import choice, integer

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One drawn problem with its dtype, schedule and input seed."""

    problem: Problem
    dtype: str = "bf16"
    schedule: str = "naive"
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.problem, Problem):
            raise TypeError(f"Case.problem must be a dash_ref.Problem, got "
                            f"{type(self.problem).__name__}")
        choice("Case.dtype", self.dtype, DTYPES)
        choice("Case.schedule", self.schedule, ("auto", *NAMES, *RAGGED))
        integer("Case.seed", self.seed, minimum=0)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def causal(self) -> bool:
        return self.problem.mask == "causal"

    def tensors(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
        """Seeded standard-normal ``q, k, v, do`` in ``(B, S, H, d)`` layout (a packed
        problem: ``(total_q, H, d)`` and ``(total_k, H_kv, d)``)."""
        p = self.problem
        gen = torch.Generator().manual_seed(self.seed)
        if p.is_packed:
            def packed(s: int, h: int) -> torch.Tensor:
                x = torch.randn(s, h, p.head_dim, generator=gen)
                return x.to(self.torch_dtype).to(device)

            return (packed(p.total_q, p.heads), packed(p.total_k, p.heads_kv),
                    packed(p.total_k, p.heads_kv), packed(p.total_q, p.heads))

        def draw(s: int, h: int) -> torch.Tensor:
            x = torch.randn(p.batch, s, h, p.head_dim, generator=gen)
            return x.to(self.torch_dtype).to(device)

        return (draw(p.seqlen_q, p.heads), draw(p.seqlen_k, p.heads_kv),
                draw(p.seqlen_k, p.heads_kv), draw(p.seqlen_q, p.heads))

    def flags(self, tiles: bool = True) -> str:
        """The command-line flags that rebuild this case (for one-line reproducers);
        ``tiles=False`` leaves out ``--block-m``/``--block-n`` (for an implementation that
        chooses its own tiles, which ``dash-verify check`` refuses them for)."""
        p = self.problem
        if p.is_packed:
            raise ValueError("Case.flags: the command line takes rectangular problems only; "
                             "this case is a packed batch")
        blocks = f"--block-m {p.block_m} --block-n {p.block_n} " if tiles else ""
        return (f"--batch {p.batch} --heads {p.heads} --heads-kv {p.heads_kv} "
                f"--seqlen-q {p.seqlen_q} --seqlen-k {p.seqlen_k} --head-dim {p.head_dim} "
                f"--mask {p.mask} {blocks}"
                f"--dtype {self.dtype} --schedule {self.schedule} --seed {self.seed}")


def elements(p: Problem) -> int:
    """Elements of ``q, k, v, do`` together: what the memory budget bounds."""
    if p.is_packed:
        return p.head_dim * (2 * p.total_q * p.heads + 2 * p.total_k * p.heads_kv)
    return p.batch * p.head_dim * (2 * p.seqlen_q * p.heads + 2 * p.seqlen_k * p.heads_kv)


def seqlens(max_len: int = 300, tiles: tuple[int, ...] = (16, 32, 64, 128)) -> st.SearchStrategy:
    """Lengths that stress tiling: 1, tile multiples, one off either side, and anything."""
    edges = {1, 2, 3}
    for t in tiles:
        edges |= {t - 1, t, t + 1, 2 * t - 1, 2 * t + 1}
    edges = sorted(x for x in edges if 1 <= x <= max_len)
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len))


@st.composite
def head_layouts(draw, max_kv_heads: int = 4, max_group: int = 4) -> tuple[int, int]:
    """``(H, H_kv)`` with ``H % H_kv == 0``: MHA (group 1), GQA and MQA (``H_kv = 1``)."""
    h_kv = draw(st.integers(1, max_kv_heads))
    return h_kv * draw(st.integers(1, max_group)), h_kv


def problems(max_elements: int = 200_000, head_dims: tuple[int, ...] = (16, 32, 64, 128),
             masks: tuple[str, ...] = ("full", "causal"),
             blocks: tuple[tuple[int, int], ...] = ((16, 16), (32, 16), (64, 64), (128, 128)),
             max_len: int = 300) -> st.SearchStrategy:
    """A :class:`Problem` whose inputs hold at most ``max_elements`` numbers.

    Lengths are drawn first (tiling bugs live there), against the budget of one head;
    batch and heads then take what the budget leaves, shrinking towards one.
    """
    integer("max_elements", max_elements, minimum=1)
    integer("max_len", max_len, minimum=1)
    for d in head_dims:
        integer("head_dims[...]", d, minimum=1)
    for bm, bn in blocks:
        integer("blocks[...]", bm, minimum=1)
        integer("blocks[...]", bn, minimum=1)
    return _problems(max_elements, head_dims, masks, blocks, max_len)


@st.composite
def _problems(draw, max_elements: int, head_dims: tuple[int, ...], masks: tuple[str, ...],
              blocks: tuple[tuple[int, int], ...], max_len: int) -> Problem:
    d = draw(st.sampled_from(head_dims))
    bm, bn = draw(st.sampled_from(blocks))
    longest = max(1, min(max_len, max_elements // (4 * d)))
    s_q, s_k = draw(seqlens(longest)), draw(seqlens(longest))
    heads, heads_kv = draw(head_layouts())
    batch = draw(st.integers(1, 3))
    mask = draw(st.sampled_from(masks))

    def make(b: int, h: int, h_kv: int) -> Problem:
        return Problem(b, h, h_kv, s_q, s_k, d, mask, bm, bn)

    p = make(batch, heads, heads_kv)
    for smaller in ((1, heads, heads_kv), (1, heads_kv, heads_kv), (1, 1, 1)):
        if elements(p) <= max_elements:
            break
        p = make(*smaller)
    return p


@st.composite
def cases(draw, max_elements: int = 200_000, schedules: tuple[str, ...] = NAMES,
          dtypes: tuple[str, ...] = ("bf16", "fp16"), **problem_kwargs) -> Case:
    """A :class:`Case`: a problem, a dtype, a schedule name and an input seed."""
    return Case(
        problem=draw(problems(max_elements=max_elements, **problem_kwargs)),
        dtype=draw(st.sampled_from(dtypes)),
        schedule=draw(st.sampled_from(schedules)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# ---------------------------------------------------------------------------------------
# packed batches
# ---------------------------------------------------------------------------------------
LENGTH_KINDS = ("empty", "one", "edge", "short", "short", "short", "long")


@st.composite
def ragged_lengths(draw, longest: int, tiles: tuple[int, ...] = (16, 32)) -> int:
    """One sequence's length from a heavy-tailed mix: mostly short (up to two tiles), now and
    then up to ``longest``; empty sequences, length 1 and one off a tile multiple on purpose."""
    kind = draw(st.sampled_from(LENGTH_KINDS))
    if kind == "empty":
        return 0
    if kind == "one" or longest <= 1:
        return min(1, longest)
    if kind == "edge":
        edges = sorted({x for t in tiles for x in (t - 1, t, t + 1)} | {2, 3})
        return draw(st.sampled_from([x for x in edges if x <= longest] or [1]))
    if kind == "short":
        return draw(st.integers(0, min(longest, 2 * max(tiles))))
    return draw(st.integers(1, longest))


def packed_problems(max_elements: int = 60_000, head_dims: tuple[int, ...] = (8, 16, 32),
                    masks: tuple[str, ...] = ("full", "causal"),
                    blocks: tuple[tuple[int, int], ...] = ((16, 16), (32, 16), (16, 32)),
                    max_len: int = 160, max_batch: int = 5) -> st.SearchStrategy:
    """A packed :class:`Problem` (``seqlens_q``, ``seqlens_k``) whose inputs hold at most
    ``max_elements`` numbers.

    Per sequence: a length from :func:`ragged_lengths`, then either the same key length
    (self-attention) or one of its own (``S_q != S_k``, both ways). The lengths are drawn
    against the budget of one head per sequence; heads then take what the budget leaves,
    shrinking towards one. Shrinks towards fewer, shorter sequences.
    """
    integer("max_elements", max_elements, minimum=1)
    integer("max_len", max_len, minimum=1)
    integer("max_batch", max_batch, minimum=1)
    for d in head_dims:
        integer("head_dims[...]", d, minimum=1)
    for bm, bn in blocks:
        integer("blocks[...]", bm, minimum=1)
        integer("blocks[...]", bn, minimum=1)
    return _packed_problems(max_elements, head_dims, masks, blocks, max_len, max_batch)


@st.composite
def _packed_problems(draw, max_elements: int, head_dims: tuple[int, ...],
                     masks: tuple[str, ...], blocks: tuple[tuple[int, int], ...], max_len: int,
                     max_batch: int) -> Problem:
    d = draw(st.sampled_from(head_dims))
    bm, bn = draw(st.sampled_from(blocks))
    batch = draw(st.integers(1, max_batch))
    longest = max(1, min(max_len, max_elements // (4 * d * batch)))
    tiles = tuple(sorted({bm, bn}))
    seqlens_q, seqlens_k = [], []
    for _ in range(batch):
        s_q = draw(ragged_lengths(longest, tiles))
        s_k = s_q if draw(st.booleans()) else draw(ragged_lengths(longest, tiles))
        seqlens_q.append(s_q)
        seqlens_k.append(s_k)
    heads, heads_kv = draw(head_layouts(max_kv_heads=3, max_group=3))
    mask = draw(st.sampled_from(masks))

    def make(h: int, h_kv: int) -> Problem:
        return Problem.packed(seqlens_q, seqlens_k, h, h_kv, d, mask, bm, bn)

    p = make(heads, heads_kv)
    for smaller in ((heads_kv, heads_kv), (1, 1)):
        if elements(p) <= max_elements:
            break
        p = make(*smaller)
    return p


@st.composite
def packed_cases(draw, max_elements: int = 60_000,
                 schedules: tuple[str, ...] = (*NAMES, *RAGGED),
                 dtypes: tuple[str, ...] = ("bf16", "fp16"), **problem_kwargs) -> Case:
    """A :class:`Case` of a packed problem (:func:`packed_problems`)."""
    return Case(
        problem=draw(packed_problems(max_elements=max_elements, **problem_kwargs)),
        dtype=draw(st.sampled_from(dtypes)),
        schedule=draw(st.sampled_from(schedules)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
