"""Head dims that are not powers of two (96, 192), head dim 256, and values with a head dim
of their own (``d_v != d``: DeepSeek's 192 / 128) on the Triton kernels, run in Triton's CPU
interpreter through dash_cuda's own call path (``tests/triton_interpreter.py``).

- **L2 on the CPU.** A tile holds the next power of two of its head dim (96 as 128, 192 as
  256) and its padding columns read 0 and are never written. With the interpreter given the
  GPU's rounding (``hopper=True``), an audited ``exact=True`` backward gives
  ``dash_ref.emulate.backward(..., arithmetic="exact")``'s bits on every step (``D``, every
  dQ partial, every dQ accumulator, the per-head dK/dV accumulators without GQA, dQ, dK,
  dV), fed the kernel's own ``O`` and ``LSE2``, where the emulator knows nothing of padding:
  a padding column that leaked into a sum, or a column left unwritten, changes bits (or
  leaves the NaN poison). A packed batch at 192 / 128 likewise.
- **Accuracy.** ``O`` and the gradients, of the exact and the default arithmetic, within the
  float64 reference's bound (``verify.reference.grad_checks``), which the outputs of the
  same call with ``v``'s columns permuted leave: the check can fail.
- **Shapes.** ``O`` and ``dO`` take ``v``'s head dim, ``dV`` is ``v``'s shape; the custom
  op's fake implementation gives the real output's shape; a mismatched ``dO`` or an
  unsupported value head dim is refused in one line naming it, before any CUDA check.
- **Backends.** The CuTe backend refuses ``d_v != d`` and head dims 192 and 256 in one
  line, and ``"auto"`` takes such calls to Triton.

Outputs are poisoned with NaN before each run; inputs are fresh seeded draws. Interpreted
programs run one after another, so the persistent backward runs on one worker.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

from test_varlen_triton import SEQLENS_K, SEQLENS_Q, emulated_steps, varlen_call  # noqa: E402
from triton_interpreter import run  # noqa: E402

import dash_cuda  # noqa: E402
from dash_cuda.backends import Case, choose_backend, get_backend  # noqa: E402
from dash_cuda.backends.triton.config import backward_config  # noqa: E402
from dash_cuda.ops import attention_op  # noqa: E402
from dash_ref import Problem  # noqa: E402
from dash_ref.emulate import replay  # noqa: E402
from dash_ref.schedules import build_schedule  # noqa: E402
from verify.reference import attention_f64, grad_checks  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16
# (name, causal, S_q, S_k, H, H_kv, d, d_v, dtype, schedule)
CASES = [
    ("d192-v128-causal-gqa", True, 70, 90, 2, 1, 192, 128, BF16, "descending"),
    ("d96-full", False, 60, 50, 2, 2, 96, 96, F16, "naive"),
    ("d256-causal", True, 65, 65, 2, 2, 256, 256, BF16, "shift"),
    ("d64-v32-full", False, 40, 70, 2, 2, 64, 32, F16, "spt"),
    ("d32-v96-causal", True, 50, 30, 2, 2, 32, 96, BF16, "symmetric_shift"),  # rows see none
]
NAMES = [c[0] for c in CASES]


def inputs(case, seed):
    _, _, s_q, s_k, h, hk, d, dv, dtype, _ = case
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=gen).to(dtype)
                 for shape in ((1, s_q, h, d), (1, s_k, hk, d), (1, s_k, hk, dv),
                               (1, s_q, h, dv)))


def passes(tensors, exact, schedule, causal):
    q, k, v, do = tensors
    return dict(kind="passes", q=q, k=k, v=v, do=do, audit=exact,
                kwargs=dict(num_workers=1, backend="triton", causal=causal,
                            schedule=schedule, exact=exact))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    calls = []
    for n, case in enumerate(CASES):
        tensors = inputs(case, seed=400 + n)
        calls += [passes(tensors, True, case[9], case[1]),
                  passes(tensors, False, case[9], case[1])]
    return run(calls, tmp_path_factory.mktemp("head_dims"), hopper=True)


def problem_of(case):
    _, causal, s_q, s_k, h, hk, d, dv, *_ = case
    return dash_cuda.backward_problem(1, h, hk, s_q, s_k, d, causal, head_dim_v=dv)


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_exact_backward_is_the_emulators_bit_for_bit(runs, index):
    case, c = CASES[index], runs[2 * index]
    problem = problem_of(case)
    assert (problem.head_dim, problem.head_dim_v) == case[6:8]
    assert (problem.block_m, problem.block_n) == (backward_config(case[6], case[7]).block_m,
                                                  backward_config(case[6], case[7]).block_n)
    steps = emulated_steps(c, problem)
    assert len(steps) == (8 if case[4] == case[5] else 6)
    for name, got, want in steps:
        assert not got.isnan().any(), name  # every element written
        assert torch.equal(got, want), name
    out = c["out"]
    acc = replay(build_schedule(problem, case[9], 1), out["partials"],
                 flush_subnormals=out["flush_subnormals"])
    assert torch.equal(out["dq_acc"], acc)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_outputs_are_within_the_float64_bound(runs, index, exact):
    case, c = CASES[index], runs[2 * index + (0 if exact else 1)]
    out = c["out"]
    assert out["o"].shape == c["do"].shape and out["dv"].shape == c["v"].shape
    ref = attention_f64(c["q"], c["k"], c["v"], c["do"], causal=case[1])
    got = {n: out[n] for n in ("o", "dq", "dk", "dv")}
    for name, check in grad_checks(got, ref, case[8]).items():
        assert check.ok, (name, check)
    shuffled = c["v"][..., torch.randperm(case[7], generator=torch.Generator().manual_seed(1))]
    wrong = attention_f64(c["q"], c["k"], shuffled, c["do"], causal=case[1])
    assert not grad_checks({"o": out["o"]}, wrong, case[8])["o"].ok  # the check can fail


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory):
    gen = torch.Generator().manual_seed(450)
    total_q, total_k = sum(SEQLENS_Q), sum(SEQLENS_K)
    q, k, v, do = (torch.randn(*shape, generator=gen).to(BF16)
                   for shape in ((total_q, 2, 192), (total_k, 1, 192), (total_k, 1, 128),
                                 (total_q, 2, 128)))
    call = varlen_call("passes_varlen", (q, k, v, do), SEQLENS_Q, SEQLENS_K, audit=True,
                       causal=True, schedule="lpt", exact=True, backend="triton")
    return run([call], tmp_path_factory.mktemp("head_dims_packed"), hopper=True)[0]


def test_the_exact_packed_backward_with_a_value_head_dim_is_the_emulators(packed_run):
    cfg = backward_config(192, 128)
    problem = Problem.packed(SEQLENS_Q, SEQLENS_K, 2, 1, 192, "causal", cfg.block_m,
                             cfg.block_n, head_dim_v=128)
    steps = emulated_steps(packed_run, problem)
    assert len(steps) == 6 and packed_run["out"]["o"].shape[-1] == 128
    for name, got, want in steps:
        assert not got.isnan().any(), name
        assert torch.equal(got, want), name


def test_the_fake_output_has_the_values_head_dim():
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 192, dtype=BF16)
        k = torch.empty(2, 80, 2, 192, dtype=BF16)
        v = torch.empty(2, 80, 2, 128, dtype=BF16)
        o, lse = attention_op(q, k, v, None, True, 0.07, "auto", True, False, None, False,
                              "auto", [-1, -1], 0.0)
    assert tuple(o.shape) == (2, 64, 4, 128) and tuple(lse.shape) == (2, 64, 4)


@pytest.mark.parametrize("shapes, says", [
    (((1, 8, 2, 192), (1, 8, 2, 192), (1, 8, 2, 100)), "v's head dim 100 is not supported"),
    (((1, 8, 2, 192), (1, 8, 2, 192), (1, 9, 2, 128)), "k and v must have the same batch"),
])
def test_bad_value_shapes_are_refused_in_one_line(shapes, says):
    q, k, v = (torch.randn(s).to(BF16) for s in shapes)
    with pytest.raises(ValueError, match=says) as err:
        dash_cuda.attention(q, k, v)
    assert "\n" not in str(err.value)


def test_a_do_without_the_values_head_dim_is_refused_in_one_line():
    q, k = torch.randn(1, 8, 2, 192).to(BF16), torch.randn(1, 8, 2, 192).to(BF16)
    v = torch.randn(1, 8, 2, 128).to(BF16)
    o, lse = torch.randn(1, 8, 2, 128).to(BF16), torch.randn(1, 8, 2)
    with pytest.raises(ValueError, match="do must have the shape of q with v's head dim") as e:
        dash_cuda.attention_backward(q, k, v, o, lse, torch.randn(1, 8, 2, 192).to(BF16))
    assert "(1, 8, 2, 128)" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("head_dim, head_dim_v", [(128, 64), (256, 128), (192, 64)])
def test_cute_refuses_what_its_kernels_lack_and_auto_takes_triton(head_dim, head_dim_v):
    """A value head dim CuTe has no kernel for (it has 192 / 128 only) is refused in one
    line for that reason, and ``auto`` runs the call on Triton."""
    case = Case(head_dim, BF16, False, True, head_dim_v=head_dim_v)
    reason = get_backend("cute").unsupported(case)
    assert reason is not None and "\n" not in reason
    assert f"value head dim {head_dim_v} at head dim {head_dim}" in reason
    assert get_backend("triton").unsupported(case) is None
    if get_backend("triton").missing() is None:
        assert choose_backend("auto", case).name == "triton"


def test_flash_attention_entry_points_take_a_value_head_dim():
    """FlashAttention's own names pass a 192 / 128 call through every structural check (to
    the CUDA check, the last), rectangular and packed."""
    q, k = torch.randn(1, 8, 2, 192).to(BF16), torch.randn(1, 8, 2, 192).to(BF16)
    v = torch.randn(1, 8, 2, 128).to(BF16)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.flash_attn_func(q, k, v, causal=True)
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 5, 5, causal=True)
