"""Sliding windows (``window_size=(left, right)``) on the Triton kernels, run in Triton's CPU
interpreter through dash_cuda's own call path (``tests/triton_interpreter.py``).

- **L2 on the CPU.** With the interpreter given the GPU's rounding (``hopper=True``), an
  audited ``exact=True`` backward on a window gives ``dash_ref.emulate.backward(...,
  arithmetic="exact")``'s bits on every step (``D``, every dQ partial, every dQ
  accumulator, the per-head dK/dV accumulators without GQA, dQ, dK, dV), fed the kernel's
  own ``O`` and ``LSE2``; the audit record's partials replayed in the schedule's dQ orders
  give its dQ accumulator. The emulator asks :class:`dash_ref.Mask` which elements a tile
  keeps and the schedule lists only the tile pairs some row sees, so a kernel window side
  off by one key, or a visited pair it masks wrongly, changes bits. Windows: a causal
  sliding window (``causal=True`` drops the right side), one-sided, two-sided, asymmetric
  with rows that see no key (``S_q > S_k``), zero-width (the diagonal alone), unbounded on
  either side, wider than the sequence; ``S_q != S_k``, GQA, odd lengths.
- **The forward.** Its arithmetic is not emulated (``docs/design.md`` section 5), so its
  ``O`` is held to the float64 reference of the window (``verify.reference``); a row that
  sees no key gives ``O = 0`` and ``LSE2 = -inf`` exactly, every other row a finite
  ``LSE2``. Its tile walk is held bit for bit where two rules see the same keys: a window
  wider than the sequence gives the full mask's bits, ``(left >= S_k, 0)`` the causal
  mask's, forward and backward.
- **Packed batches with a window**: the exact packed backward is the emulator's on every
  step, and each sequence's ``O``, ``LSE2``, ``dQ``, ``dK``, ``dV`` are the bits of the same
  sequence run alone at batch 1 (portable schedules, the default arithmetic).
- **Bad windows** are refused in one line naming ``window_size`` before any CUDA check.

Outputs are poisoned with NaN before each run; inputs are fresh seeded draws. Interpreted
programs run one after another, so the persistent backward runs on one worker. The
forward's tiles are 128 x 64 and the backward's 64 x 128 at these head dims; the longer
cases put a masked left edge, a dense interior and a masked right edge in one Q tile.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

from test_varlen_triton import emulated_steps, offsets, packed_inputs  # noqa: E402
from triton_interpreter import run  # noqa: E402

import dash_cuda  # noqa: E402
from dash_cuda.backends.triton.config import backward_config  # noqa: E402
from dash_ref import Mask, Problem, build_schedule  # noqa: E402
from dash_ref.emulate import replay  # noqa: E402
from verify.reference import (  # noqa: E402
    attention_f64,
    attention_f64_packed,
    grad_checks,
    packed_grad_checks,
)

F16, BF16 = torch.float16, torch.bfloat16
# (name, causal, window_size, S_q, S_k, H, H_kv, d, dtype, schedule)
CASES = [
    ("causal-sliding", True, (200, 50), 300, 300, 2, 1, 16, F16, "descending"),  # (200, 0)
    ("one-sided", False, (45, 0), 150, 150, 2, 2, 16, BF16, "naive"),
    ("two-sided", False, (150, 90), 260, 330, 2, 1, 16, BF16, "banded"),
    ("asymmetric", False, (70, 3), 130, 90, 2, 2, 32, F16, "shift"),  # rows 0..36 see none
    ("zero-width", False, (0, 0), 77, 77, 1, 1, 16, F16, "spt"),
    ("left-unbounded", False, (-1, 32), 200, 230, 2, 1, 16, BF16, "interleaved"),
    ("right-unbounded", False, (32, -1), 101, 99, 2, 2, 16, F16, "descending"),
    ("wider", False, (500, 300), 50, 61, 2, 2, 16, BF16, "naive"),
]
# (name of the windowed case, causal, window_size, causal of the same rule without a window)
SAME_RULE = [("wider", False, (500, 300), False), ("causal-wide", True, (1000, 0), True)]


def inputs(s_q, s_k, heads, heads_kv, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=gen).to(dtype)
                 for shape in ((1, s_q, heads, d), (1, s_k, heads_kv, d), (1, s_k, heads_kv, d),
                               (1, s_q, heads, d)))


def passes(tensors, audit=True, **kwargs):
    q, k, v, do = tensors
    return dict(kind="passes", q=q, k=k, v=v, do=do, audit=audit,
                kwargs=dict(num_workers=1, backend="triton", **kwargs))


def problem_of(case) -> Problem:
    _, causal, window, s_q, s_k, h, hk, d, *_ = case
    return dash_cuda.backward_problem(1, h, hk, s_q, s_k, d, causal, window_size=window)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    calls = []
    for n, (_, causal, window, s_q, s_k, h, hk, d, dtype, schedule) in enumerate(CASES):
        tensors = inputs(s_q, s_k, h, hk, d, dtype, seed=200 + n)
        calls.append(passes(tensors, causal=causal, window_size=window, schedule=schedule,
                            exact=True))
    for _, causal, window, plain_causal in SAME_RULE:  # one rule spelled two ways
        tensors = inputs(150, 90, 2, 1, 16, F16, seed=300 + len(calls))
        calls.append(passes(tensors, causal=causal, window_size=window, schedule="naive",
                            exact=True))
        calls.append(passes(tensors, causal=plain_causal, schedule="naive", exact=True))
    return run(calls, tmp_path_factory.mktemp("window_exact"), hopper=True)


NAMES = [c[0] for c in CASES]
SKIPS_PAIRS = ("causal-sliding", "one-sided", "two-sided", "left-unbounded")


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_exact_window_backward_is_the_emulators_bit_for_bit(runs, index):
    c, case = runs[index], CASES[index]
    problem = problem_of(case)
    assert problem.is_windowed and problem.visibility == Mask.of(case[1], case[2])
    assert (problem.block_m, problem.block_n) == (backward_config(case[7]).block_m,
                                                  backward_config(case[7]).block_n)
    steps = emulated_steps(c, problem)
    assert len(steps) == (8 if case[5] == case[6] else 6)
    for name, got, want in steps:
        assert not got.isnan().any(), name  # every element written
        assert torch.equal(got, want), name
    out = c["out"]
    schedule = build_schedule(problem, case[9], 1)
    acc = replay(schedule, out["partials"], flush_subnormals=out["flush_subnormals"])
    assert torch.equal(out["dq_acc"], acc)


def test_the_windows_are_not_vacuous():
    """Each window but the widest hides keys; on the longer sequences the schedule skips
    tile pairs that no row sees (so the kernel's tables differ from the full mask's); the
    asymmetric window has rows that see no key."""
    for case in CASES:
        p = problem_of(case)
        rule, s_q, s_k = p.visibility, p.seqlen_q, p.seqlen_k
        hidden = not rule.visible(range(s_q), range(s_k), s_q, s_k).all()
        full = Problem(1, p.heads, p.heads_kv, s_q, s_k, p.head_dim, "full", p.block_m,
                       p.block_n)
        fewer = (build_schedule(p, "naive", 1).num_visits
                 < build_schedule(full, "naive", 1).num_visits)
        assert hidden == (case[0] != "wider"), case[0]
        assert fewer == (case[0] in SKIPS_PAIRS), case[0]
    p = problem_of(CASES[NAMES.index("asymmetric")])
    assert not p.visibility.keys(36, p.seqlen_q, p.seqlen_k)
    assert p.visibility.keys(37, p.seqlen_q, p.seqlen_k)


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_the_window_forward_is_within_the_float64_bound(runs, index):
    """``O`` (and the exact gradients) within the float64 reference's bound; rows that see
    no key: ``O = 0``, ``LSE2 = -inf`` exactly; every other row a finite ``LSE2``."""
    c, case = runs[index], CASES[index]
    _, causal, window, s_q, s_k, *_, dtype, _ = case
    out = c["out"]
    ref = attention_f64(c["q"], c["k"], c["v"], c["do"], causal, window_size=window)
    for check in grad_checks({n: out[n] for n in ("o", "dq", "dk", "dv")}, ref,
                             dtype).values():
        assert check.ok, check
    rule = Mask.of(causal, window)
    sees = torch.tensor([len(rule.keys(r, s_q, s_k)) > 0 for r in range(s_q)])
    lse = out["lse"][0]  # (S_q, H)
    assert torch.equal(out["o"][0][~sees], torch.zeros_like(out["o"][0][~sees]))
    assert (lse[~sees] == -math.inf).all() and torch.isfinite(lse[sees]).all()


@pytest.mark.parametrize("index", range(len(SAME_RULE)), ids=[s[0] for s in SAME_RULE])
def test_a_window_that_hides_nothing_more_gives_the_plain_masks_bits(runs, index):
    """A window wider than the sequence is the full mask; ``(left >= S_k, 0)`` is the causal
    mask: the window kernels walk the same tiles with the same element masks, so every
    output is the same bits."""
    windowed, plain = runs[len(CASES) + 2 * index], runs[len(CASES) + 2 * index + 1]
    _, causal, window, plain_causal = SAME_RULE[index]
    assert Mask.of(causal, window).kind == "window"
    for n in ("o", "lse", "dq", "dk", "dv", "partials", "dq_acc"):
        assert not windowed["out"][n].isnan().any(), n
        assert torch.equal(windowed["out"][n], plain["out"][n]), n
    if plain_causal:  # not vacuous: the causal rule hides keys here
        assert (plain["out"]["lse"][0, :59] == -math.inf).all()


# -- packed batches ------------------------------------------------------------------------------
SEQLENS_Q = (5, 0, 37, 70, 160, 7)
SEQLENS_K = (12, 3, 20, 200, 140, 0)
# (causal, window_size, schedule): a causal sliding window, a two-sided one
PACKED = [(True, (30, 30), "descending"), (False, (20, 6), "naive")]


def _split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    cu = offsets(lengths).tolist()
    return [x[cu[b]:cu[b + 1]] for b in range(len(lengths))]


@pytest.fixture(scope="module")
def packed_runs(tmp_path_factory):
    calls = []
    for n, (causal, window, schedule) in enumerate(PACKED):
        tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, 2, 1, 16, BF16, seed=400 + n)
        cu = dict(cu_seqlens_q=offsets(SEQLENS_Q), cu_seqlens_k=offsets(SEQLENS_K),
                  max_seqlen_q=max(SEQLENS_Q), max_seqlen_k=max(SEQLENS_K))
        kw = dict(causal=causal, window_size=window, schedule=schedule, num_workers=1)
        q, k, v, do = tensors
        calls.append(dict(kind="passes_varlen", q=q, k=k, v=v, do=do, audit=True, **cu,
                          kwargs=dict(kw, exact=True)))
        calls.append(dict(kind="passes_varlen", q=q, k=k, v=v, do=do, **cu, kwargs=kw))
        for b in range(len(SEQLENS_Q)):  # each sequence alone, batch 1
            q1, k1, v1, do1 = (_split(x, SEQLENS_K if i in (1, 2) else SEQLENS_Q)[b][None]
                               for i, x in enumerate(tensors))
            calls.append(dict(kind="passes", q=q1, k=k1, v=v1, do=do1,
                              kwargs=dict(kw, backend="triton")))
    return run(calls, tmp_path_factory.mktemp("window_packed"), hopper=True)


PER_PACKED = 2 + len(SEQLENS_Q)


@pytest.mark.parametrize("index", range(len(PACKED)), ids=["causal-sliding", "two-sided"])
def test_exact_packed_window_backward_is_the_emulators_bit_for_bit(packed_runs, index):
    causal, window, _ = PACKED[index]
    c = packed_runs[index * PER_PACKED]
    d = c["q"].shape[-1]
    problem = Problem.packed(SEQLENS_Q, SEQLENS_K, 2, 1, d, "causal" if causal else "full",
                             backward_config(d).block_m, backward_config(d).block_n,
                             window_size=window)
    for name, got, want in emulated_steps(c, problem):
        assert not got.isnan().any(), name
        assert torch.equal(got, want), name
    out = c["out"]
    ref = attention_f64_packed(c["q"], c["k"], c["v"], c["do"], SEQLENS_Q, SEQLENS_K, causal,
                               window_size=window)
    for checks in packed_grad_checks({n: out[n] for n in ("o", "dq", "dk", "dv")}, ref, BF16):
        for check in checks.values():
            assert check.ok, check


@pytest.mark.parametrize("index", range(len(PACKED)), ids=["causal-sliding", "two-sided"])
def test_each_windowed_sequence_gets_its_batch_1_bits(packed_runs, index):
    packed, *alone = packed_runs[index * PER_PACKED + 1:(index + 1) * PER_PACKED]
    names = ("o", "lse", "dq", "dk", "dv")
    parts = {n: _split(packed["out"][n], SEQLENS_K if n in ("dk", "dv") else SEQLENS_Q)
             for n in names}
    for b in range(len(SEQLENS_Q)):
        for n in names:
            mine = parts[n][b]
            assert not mine.isnan().any(), (b, n)
            assert torch.equal(mine, alone[b]["out"][n][0]), (b, n)
    # not vacuous: the window hides keys of the long sequences
    rule = Mask.of(*PACKED[index][:2])
    assert not rule.visible(range(160), range(140), 160, 140).all()


# -- bad windows ---------------------------------------------------------------------------------
@pytest.mark.parametrize("window, error, says", [
    ((-2, 0), ValueError, r"window_size\[0\] must be >= 0, or -1"),
    ((4, -3), ValueError, r"window_size\[1\] must be >= 0, or -1"),
    ((2.0, 0), TypeError, r"window_size\[0\] must be an int"),
    ((1, 2, 3), TypeError, "window_size must be a pair"),
])
def test_bad_windows_are_refused_in_one_line_before_the_cuda_check(window, error, says):
    """CPU tensors and ``backend="triton"``: the window's error comes first."""
    q = torch.randn(1, 8, 2, 16, dtype=BF16)
    packed = torch.randn(8, 2, 16, dtype=BF16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    for call in (lambda: dash_cuda.attention(q, q, q, window_size=window, backend="triton"),
                 lambda: dash_cuda.attention_varlen(packed, packed, packed, cu, cu, 8, 8,
                                                    window_size=window, backend="triton")):
        with pytest.raises(error, match=says) as info:
            call()
        assert "\n" not in str(info.value)
