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

FlashAttention's other features (off unless asked for, so the strategies above draw what
they always drew): ``problems(windows=True)`` and ``packed_problems(windows=True)`` add
sliding windows from :func:`window_sizes` (one-sided, two-sided, zero-width, wider than
the sequence, combined with ``causal``), ``value_head_dims=(...)`` a value head dim of its
own; :func:`softcaps` and :func:`learnable_sinks` draw the other two, and
:func:`feature_cases` a :class:`Case` with all four (``Case.softcap``,
``Case.learnable_sink``; its :meth:`Case.tensors` give ``v`` and ``dO`` their head dim).
Every strategy here draws a bounded problem; a test keeps its run short with
``settings(max_examples=..., deadline=None)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from hypothesis import strategies as st

from dash_ref import BANDED, NAMES, RAGGED, Problem
from dash_ref._checks import choice, integer, number

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One drawn problem with its dtype, schedule and input seed."""

    problem: Problem
    dtype: str = "bf16"
    schedule: str = "naive"
    seed: int = 0
    softcap: float = 0.0  # FlashAttention's softcap (0: none)
    learnable_sink: tuple[float, ...] | None = None  # one logit per query head (fp32 values)

    def __post_init__(self) -> None:
        if not isinstance(self.problem, Problem):
            raise TypeError(f"Case.problem must be a dash_ref.Problem, got "
                            f"{type(self.problem).__name__}")
        choice("Case.dtype", self.dtype, DTYPES)
        choice("Case.schedule", self.schedule, ("auto", *NAMES, *RAGGED, *BANDED))
        integer("Case.seed", self.seed, minimum=0)
        number("Case.softcap", self.softcap, minimum=0.0)
        if self.learnable_sink is not None:
            sinks = tuple(self.learnable_sink)
            if len(sinks) != self.problem.heads:
                raise ValueError(f"Case.learnable_sink has {len(sinks)} logits, the problem "
                                 f"{self.problem.heads} query heads: one per head")
            for n, x in enumerate(sinks):
                number(f"Case.learnable_sink[{n}]", x)
            object.__setattr__(self, "learnable_sink", sinks)

    def __repr__(self) -> str:
        """The dataclass's, with ``softcap`` and ``learnable_sink`` only where set (a case
        without them reads as it always has, so shrunk counterexamples stay short)."""
        unset = {"softcap": 0.0, "learnable_sink": None}
        given = [f.name for f in fields(self)
                 if f.name not in unset or getattr(self, f.name) != unset[f.name]]
        return f"Case({', '.join(f'{n}={getattr(self, n)!r}' for n in given)})"

    @property
    def sink_tensor(self) -> torch.Tensor | None:
        """``learnable_sink`` as the fp32 ``(H,)`` tensor the emulator and references take."""
        if self.learnable_sink is None:
            return None
        return torch.tensor(self.learnable_sink, dtype=torch.float32)

    @property
    def features(self) -> dict:
        """The keyword arguments of the optional features, for ``dash_ref.emulate.emulate``
        and the references: ``softcap`` and ``learnable_sink`` (the window is the
        problem's)."""
        return {"softcap": self.softcap, "learnable_sink": self.sink_tensor}

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def causal(self) -> bool:
        return self.problem.mask == "causal"

    def tensors(self, device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
        """Seeded standard-normal ``q, k, v, do`` in ``(B, S, H, d)`` layout (a packed
        problem: ``(total_q, H, d)`` and ``(total_k, H_kv, d)``); ``v`` and ``do`` with the
        problem's value head dim."""
        p = self.problem
        gen = torch.Generator().manual_seed(self.seed)
        if p.is_packed:
            def packed(s: int, h: int, d: int = p.head_dim) -> torch.Tensor:
                x = torch.randn(s, h, d, generator=gen)
                return x.to(self.torch_dtype).to(device)

            return (packed(p.total_q, p.heads), packed(p.total_k, p.heads_kv),
                    packed(p.total_k, p.heads_kv, p.head_dim_v),
                    packed(p.total_q, p.heads, p.head_dim_v))

        def draw(s: int, h: int, d: int = p.head_dim) -> torch.Tensor:
            x = torch.randn(p.batch, s, h, d, generator=gen)
            return x.to(self.torch_dtype).to(device)

        return (draw(p.seqlen_q, p.heads), draw(p.seqlen_k, p.heads_kv),
                draw(p.seqlen_k, p.heads_kv, p.head_dim_v),
                draw(p.seqlen_q, p.heads, p.head_dim_v))

    def flags(self, tiles: bool = True) -> str:
        """The command-line flags that rebuild this case (for one-line reproducers);
        ``tiles=False`` leaves out ``--block-m``/``--block-n`` (for an implementation that
        chooses its own tiles, which ``dash-verify check`` refuses them for); a window
        as ``--window-size LEFT RIGHT``, a softcap as ``--softcap CAP``, sinks as
        ``--learnable-sink=L,L,...`` (``=``: a list may start with a minus sign), each value
        written so that it reads back to the same fp32 (``repr``)."""
        p = self.problem
        features = (f"--softcap {self.softcap!r} " if self.softcap else "") + (
            "" if self.learnable_sink is None
            else f"--learnable-sink={','.join(repr(float(x)) for x in self.learnable_sink)} ")
        blocks = f"--block-m {p.block_m} --block-n {p.block_n} " if tiles else ""
        window = (f"--window-size {p.window_size[0]} {p.window_size[1]} " if p.is_windowed
                  else "")
        lengths = (f"--seqlens-q {','.join(map(str, p.seqlens_q))} "
                   f"--seqlens-k {','.join(map(str, p.seqlens_k))}" if p.is_packed else
                   f"--batch {p.batch} --seqlen-q {p.seqlen_q} --seqlen-k {p.seqlen_k}")
        return (f"{lengths} --heads {p.heads} --heads-kv {p.heads_kv} "
                f"--head-dim {p.head_dim} "
                f"{f'--head-dim-v {p.head_dim_v} ' if p.head_dim_v != p.head_dim else ''}"
                f"--mask {p.mask} {window}{features}{blocks}"
                f"--dtype {self.dtype} --schedule {self.schedule} --seed {self.seed}")


def elements(p: Problem) -> int:
    """Elements of ``q, k, v, do`` together: what the memory budget bounds."""
    d, dv = p.head_dim, p.head_dim_v
    if p.is_packed:
        return (d + dv) * (p.total_q * p.heads + p.total_k * p.heads_kv)
    return p.batch * (d + dv) * (p.seqlen_q * p.heads + p.seqlen_k * p.heads_kv)


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


def window_sizes(max_extent: int = 300, tiles: tuple[int, ...] = (16, 32, 64, 128)
                 ) -> st.SearchStrategy:
    """FlashAttention ``window_size`` pairs ``(left, right)`` that bound at least one side:
    one-sided (``-1`` on the other), two-sided, zero-width (``(0, 0)``: the diagonal only),
    tile edges and extents past ``max_extent`` (wider than the sequence: no key hidden)."""
    integer("max_extent", max_extent, minimum=0)
    edges = sorted({0, 1, 2} | {x for t in tiles for x in (t - 1, t, t + 1)}
                   | {max_extent, max_extent + 1})
    extent = st.one_of(st.just(-1), st.sampled_from(edges), st.integers(0, max_extent + 1))
    return st.tuples(extent, extent).filter(lambda w: w != (-1, -1))


def softcaps() -> st.SearchStrategy:
    """FlashAttention ``softcap`` values: small caps (most scores saturate), 1, the values
    models use (Gemma 2: 50, 30) and anything between."""
    return st.one_of(st.sampled_from((0.5, 1.0, 2.0, 5.0, 30.0, 50.0)),
                     st.floats(0.25, 64.0, allow_nan=False, allow_infinity=False))


_softcaps = softcaps  # for cases(), whose flag of that name hides it


def learnable_sinks(heads: int) -> st.SearchStrategy:
    """``heads`` sink logits (natural-log units of the scores), fp32 values: around the
    scores' own range, now and then far above (the sink takes most of each row) or below."""
    integer("heads", heads, minimum=1)
    value = st.one_of(st.floats(-4.0, 4.0, width=32), st.sampled_from((-30.0, 0.0, 12.0)))
    return st.lists(value, min_size=heads, max_size=heads).map(tuple)


def problems(max_elements: int = 200_000, head_dims: tuple[int, ...] = (16, 32, 64, 96, 128),
             masks: tuple[str, ...] = ("full", "causal"),
             blocks: tuple[tuple[int, int], ...] = ((16, 16), (32, 16), (64, 64), (128, 128)),
             max_len: int = 300, windows: bool = False,
             value_head_dims: tuple[int, ...] = ()) -> st.SearchStrategy:
    """A :class:`Problem` whose inputs hold at most ``max_elements`` numbers.

    Lengths are drawn first (tiling bugs live there), against the budget of one head;
    batch and heads then take what the budget leaves, shrinking towards one. With
    ``windows`` a sliding window from :func:`window_sizes` (with the drawn mask: under
    ``causal`` its right side is 0); with ``value_head_dims`` the value head dim is drawn
    from them or equals ``d`` (these draws come last, so without them a problem is drawn as
    it always was).
    """
    _check_sizes(max_elements, max_len, head_dims, value_head_dims, blocks)
    return _problems(max_elements, head_dims, masks, blocks, max_len, windows,
                     tuple(value_head_dims))


def _check_sizes(max_elements: int, max_len: int, head_dims: tuple[int, ...],
                 value_head_dims: tuple[int, ...], blocks: tuple[tuple[int, int], ...]) -> None:
    """The size arguments :func:`problems` and :func:`packed_problems` share: each a
    positive int."""
    integer("max_elements", max_elements, minimum=1)
    integer("max_len", max_len, minimum=1)
    for d in head_dims:
        integer("head_dims[...]", d, minimum=1)
    for d in value_head_dims:
        integer("value_head_dims[...]", d, minimum=1)
    for bm, bn in blocks:
        integer("blocks[...]", bm, minimum=1)
        integer("blocks[...]", bn, minimum=1)


@st.composite
def _problems(draw, max_elements: int, head_dims: tuple[int, ...], masks: tuple[str, ...],
              blocks: tuple[tuple[int, int], ...], max_len: int, windows: bool = False,
              value_head_dims: tuple[int, ...] = ()) -> Problem:
    d = draw(st.sampled_from(head_dims))
    bm, bn = draw(st.sampled_from(blocks))
    longest = max(1, min(max_len, max_elements // (4 * d)))
    s_q, s_k = draw(seqlens(longest)), draw(seqlens(longest))
    heads, heads_kv = draw(head_layouts())
    batch = draw(st.integers(1, 3))
    mask = draw(st.sampled_from(masks))
    window = draw(window_sizes(max(s_q, s_k), (bm, bn))) if windows else None
    dv = draw(st.sampled_from((d, *value_head_dims))) if value_head_dims else None
    if dv is not None and dv > d:  # keep to the budget the lengths were drawn against
        s_q, s_k = max(1, s_q * d // dv), max(1, s_k * d // dv)

    def make(b: int, h: int, h_kv: int) -> Problem:
        return Problem(b, h, h_kv, s_q, s_k, d, mask, bm, bn, None, None, window, dv)

    p = make(batch, heads, heads_kv)
    for smaller in ((1, heads, heads_kv), (1, heads_kv, heads_kv), (1, 1, 1)):
        if elements(p) <= max_elements:
            break
        p = make(*smaller)
    return p


@st.composite
def cases(draw, max_elements: int = 200_000, schedules: tuple[str, ...] = NAMES,
          dtypes: tuple[str, ...] = ("bf16", "fp16"), softcaps: bool = False,
          sinks: bool = False, **problem_kwargs) -> Case:
    """A :class:`Case`: a problem, a dtype, a schedule name and an input seed; with
    ``softcaps`` and ``sinks``, each about half the time, a softcap (:func:`softcaps`) and
    sinks (:func:`learnable_sinks`), drawn last (without them a case is drawn as it always
    was)."""
    problem = draw(problems(max_elements=max_elements, **problem_kwargs))
    return _case(draw, problem, schedules, dtypes, softcaps, sinks)


def _case(draw, problem: Problem, schedules: tuple[str, ...], dtypes: tuple[str, ...],
          softcaps: bool, sinks: bool) -> Case:
    """A :class:`Case` of ``problem``: a dtype, a schedule, a seed, then the features asked
    for (each about half the time)."""
    case = dict(problem=problem, dtype=draw(st.sampled_from(dtypes)),
                schedule=draw(st.sampled_from(schedules)), seed=draw(st.integers(0, 2**31 - 1)))
    if softcaps:
        case["softcap"] = draw(st.one_of(st.just(0.0), _softcaps()))
    if sinks:
        case["learnable_sink"] = draw(st.one_of(st.none(), learnable_sinks(problem.heads)))
    return Case(**case)


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
                    max_len: int = 160, max_batch: int = 5, windows: bool = False,
                    value_head_dims: tuple[int, ...] = ()) -> st.SearchStrategy:
    """A packed :class:`Problem` (``seqlens_q``, ``seqlens_k``) whose inputs hold at most
    ``max_elements`` numbers.

    Per sequence: a length from :func:`ragged_lengths`, then either the same key length
    (self-attention) or one of its own (``S_q != S_k``, both ways). The lengths are drawn
    against the budget of one head per sequence; heads then take what the budget leaves,
    shrinking towards one. Shrinks towards fewer, shorter sequences. ``windows`` and
    ``value_head_dims`` as in :func:`problems` (one window for every sequence, in its own
    coordinates).
    """
    _check_sizes(max_elements, max_len, head_dims, value_head_dims, blocks)
    integer("max_batch", max_batch, minimum=1)
    return _packed_problems(max_elements, head_dims, masks, blocks, max_len, max_batch,
                            windows, tuple(value_head_dims))


@st.composite
def _packed_problems(draw, max_elements: int, head_dims: tuple[int, ...],
                     masks: tuple[str, ...], blocks: tuple[tuple[int, int], ...], max_len: int,
                     max_batch: int, windows: bool = False,
                     value_head_dims: tuple[int, ...] = ()) -> Problem:
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
    window = (draw(window_sizes(max(seqlens_q + seqlens_k), (bm, bn))) if windows
              else None)
    dv = draw(st.sampled_from((d, *value_head_dims))) if value_head_dims else None
    if dv is not None and dv > d:  # keep to the budget the lengths were drawn against
        dv = d

    def make(h: int, h_kv: int) -> Problem:
        return Problem.packed(seqlens_q, seqlens_k, h, h_kv, d, mask, bm, bn, window, dv)

    p = make(heads, heads_kv)
    for smaller in ((heads_kv, heads_kv), (1, 1)):
        if elements(p) <= max_elements:
            break
        p = make(*smaller)
    return p


@st.composite
def packed_cases(draw, max_elements: int = 60_000,
                 schedules: tuple[str, ...] = (*NAMES, *RAGGED),
                 dtypes: tuple[str, ...] = ("bf16", "fp16"), softcaps: bool = False,
                 sinks: bool = False, **problem_kwargs) -> Case:
    """A :class:`Case` of a packed problem (:func:`packed_problems`); ``softcaps`` and
    ``sinks`` as in :func:`cases`."""
    problem = draw(packed_problems(max_elements=max_elements, **problem_kwargs))
    return _case(draw, problem, schedules, dtypes, softcaps, sinks)


# ---------------------------------------------------------------------------------------
# FlashAttention's other features
# ---------------------------------------------------------------------------------------
@st.composite
def feature_cases(draw, max_elements: int = 30_000,
                  schedules: tuple[str, ...] = (*NAMES, *RAGGED, *BANDED),
                  dtypes: tuple[str, ...] = ("bf16", "fp16"), packed: bool = False,
                  value_head_dims: tuple[int, ...] = (8, 16, 24), **problem_kwargs) -> Case:
    """A :class:`Case` with FlashAttention's other features: a sliding window (always
    drawn; under ``causal`` one without a left bound is the causal mask itself), a value
    head dim drawn from ``value_head_dims`` or ``d``, and, each about half the
    time, a softcap (:func:`softcaps`) and sinks (:func:`learnable_sinks`); ``packed``
    draws a packed batch (:func:`packed_problems`). Small by default: the emulator and the
    references run on it in well under a second."""
    make = packed_problems if packed else problems
    problem = draw(make(max_elements=max_elements, windows=True,
                        value_head_dims=value_head_dims,
                        **({"head_dims": (8, 16, 32), "max_len": 160,
                            "blocks": ((16, 16), (32, 16), (16, 32))} | problem_kwargs)))
    return _case(draw, problem, schedules, dtypes, softcaps=True, sinks=True)
