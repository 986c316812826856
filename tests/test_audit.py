"""Specification of the determinism audit and the shape fuzzer (CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from cli_output import reproducer_argv

from dash_ref import Problem
from verify.audit import audit
from verify.cli import main
from verify.fuzz import check, fuzz
from verify.impls import Impl
from verify.strategies import Case

SMALL = Problem(1, 2, 1, 40, 40, 16, "full", 16, 16)
# Big enough that a reordered fp32 sum shows through the final fp16 rounding.
ORDER_SENSITIVE = Problem(1, 4, 4, 256, 256, 64, "full", 16, 16)


def test_emulated_schedules_are_deterministic_under_perturbation():
    report = audit("emulator:shift", SMALL, trials=4, perturb=True, progress=False)
    assert report.deterministic
    assert all(o.distinct == 1 and o.first_trial is None for o in report.outputs.values())
    assert "fresh allocations" in report.perturbations
    assert "DETERMINISTIC" in report.summary()


def test_pytorch_math_backend_is_deterministic_on_cpu():
    report = audit("sdpa-math", SMALL, trials=5, progress=False)
    assert report.deterministic, report.summary()
    assert "DETERMINISTIC: one bit pattern" in report.summary()


def test_audit_catches_emulated_atomics_in_dq_only():
    report = audit("emulator:atomic", ORDER_SENSITIVE, trials=4, dtype="fp16", progress=False)
    assert not report.deterministic
    dq = report.outputs["dQ"]
    assert dq.distinct > 1 and dq.max_ulp_spread >= 1 and dq.first_trial is not None
    # Atomics only reorder dQ: O, dK and dV keep their bits.
    assert all(report.outputs[n].distinct == 1 for n in ("O", "dK", "dV"))
    assert "NOT DETERMINISTIC" in report.summary()


def test_audit_catches_a_planted_order_dependent_user_callable():
    report = audit("planted:shuffled_dq", ORDER_SENSITIVE, trials=4, dtype="fp16",
                   progress=False)
    assert report.outputs["dQ"].distinct > 1
    assert report.outputs["dK"].distinct == 1


# lengths that are not tile multiples, one of length 1, S_q != S_k per sequence, GQA
PACKED = Problem.packed((200, 1, 55), (180, 7, 55), 4, 2, 64, "causal", 16, 16)


def test_a_packed_problem_is_audited_on_packed_inputs_with_its_offsets():
    seen = []

    def recorder(q, k, v, do, causal, softmax_scale, **packing):
        seen.append((tuple(q.shape), tuple(k.shape), causal,
                     {n: x.tolist() if torch.is_tensor(x) else x for n, x in packing.items()}))
        return q.clone(), q.clone(), k.clone(), k.clone()

    report = audit(Impl("recorder", recorder, packed=True), PACKED, trials=2, progress=False)
    assert report.deterministic and len(seen) == 2
    assert seen[0] == ((256, 4, 64), (242, 2, 64), True,
                       dict(cu_seqlens_q=[0, 200, 201, 256], cu_seqlens_k=[0, 180, 187, 242],
                            max_seqlen_q=200, max_seqlen_k=180))


def test_audit_catches_emulated_atomics_in_a_packed_batch():
    packed = Problem.packed((256, 130), (256, 130), 4, 4, 64, "full", 16, 16)
    report = audit("emulator:atomic", packed, trials=4, dtype="fp16", progress=False)
    assert report.outputs["dQ"].distinct > 1
    assert all(report.outputs[n].distinct == 1 for n in ("O", "dK", "dV"))
    assert audit("emulator:shift", packed, trials=3, dtype="fp16",
                 progress=False).deterministic


def test_a_packed_problem_is_refused_where_the_implementation_takes_no_packed_batch():
    def rectangular(q, k, v, do, causal, softmax_scale):
        raise AssertionError("never called")

    for impl in ("sdpa-math", Impl("rectangular", rectangular)):
        with pytest.raises(ValueError, match="takes no packed batches") as refused:
            audit(impl, PACKED, trials=2, progress=False)
        assert "\n" not in str(refused.value)


def test_fuzz_finds_and_shrinks_a_planted_shape_bug():
    result = fuzz("planted:broken_tail", budget=60, max_elements=4000, progress=False,
                  masks=("full",), head_dims=(16,))
    assert not result.ok
    p = result.failure.case.problem
    assert p.seqlen_k == 17 and p.batch == 1, result.failure.case  # smallest failing length
    assert "--seqlen-k 17" in result.reproducer()
    assert "--schedule naive" in result.reproducer()  # a user callable has no schedule
    assert not check("planted:broken_tail", result.failure.case).ok


def test_fuzz_passes_a_correct_implementation():
    result = fuzz("planted:reference_cast", budget=15, max_elements=4000, progress=False)
    assert result.ok and result.examples == 15


def test_fuzz_passes_the_emulator():
    result = fuzz("emulator:symmetric_shift", budget=6, max_elements=2000, progress=False)
    assert result.ok, result.failure and result.failure.message


@pytest.mark.parametrize(("impl", "recorded"), [
    ("emulator:shift", "shift"), ("dash:descending", "descending"), ("dash", "auto"),
    ("dash-cute:symmetric_shift", "symmetric_shift"), ("dash-exact", "auto"),
    ("dash-triton:banded", "banded"), ("dash-cute:lpt", "lpt"), ("fa4-det", "naive"),
    ("sdpa-cudnn", "naive")])
def test_fuzz_records_the_schedule_the_implementation_runs(impl, recorded):
    """Every case of an implementation that fixes its schedule carries that one (``auto``
    where the name gives none), so its reproducer names it; the peers' cases carry
    ``naive``. Each is a schedule a ``Case`` takes."""
    from verify.fuzz import recorded_schedule
    from verify.impls import Impl, get_impl

    # (FlashAttention-4 is not importable on every machine: its Impl as _resolve makes it)
    resolved = Impl(impl, fn=None, device="cuda") if impl == "fa4-det" else get_impl(impl)
    assert recorded_schedule(resolved) == recorded
    Case(Problem(1, 1, 1, 16, 16, 16, "full", 16, 16), "bf16", recorded, 0)


def test_check_reports_errors_within_the_bound():
    case = Case(Problem(1, 2, 2, 33, 17, 16, "causal", 16, 16), "fp16", "naive", 3)
    result = check("emulator:descending", case)
    assert result.ok and set(result.errors) == {"o", "dq", "dk", "dv"}


def test_cli_audit_writes_json(tmp_path, capsys):
    out = tmp_path / "audit.json"
    code = main(["audit", "--impl", "emulator:naive", "--seqlen-q", "24", "--heads", "1",
                 "--head-dim", "16", "--trials", "3", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["exit_code"] == 0 and data["command"] == "audit"
    assert data["result"]["deterministic"] is True and data["result"]["trials"] == 3
    assert "DETERMINISTIC" in capsys.readouterr().out


def test_cli_audits_a_packed_batch_from_its_lengths(tmp_path, capsys):
    out = tmp_path / "audit.json"
    code = main(["audit", "--impl", "emulator:shift", "--seqlens-q", "40,0,17", "--seqlens-k",
                 "33,5,17", "--heads", "2", "--heads-kv", "1", "--head-dim", "16", "--mask",
                 "causal", "--trials", "3", "--json", str(out)])
    assert code == 0
    problem = json.loads(out.read_text())["result"]["problem"]
    assert problem["seqlens_q"] == [40, 0, 17] and problem["seqlens_k"] == [33, 5, 17]
    assert "packed: 57 query and 55 key rows" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--impl", "sdpa-math", "--seqlens-q", "40,7"], "sdpa-math takes no packed batches"),
    (["--impl", "emulator:shift", "--seqlens-q", "40,7", "--seqlens-k", "3"],
     "--seqlens-q has 2 lengths, --seqlens-k 1"),
    (["--impl", "emulator:shift", "--seqlens-k", "3"], "--seqlens-k needs --seqlens-q"),
    (["--impl", "emulator:shift", "--seqlens-q", "0,0"], "the problem has no attention to audit"),
    (["--impl", "emulator:shift", "--seqlens-q", "4,x"], "expected an integer"),
])
def test_cli_refuses_a_bad_packed_batch_in_one_line(argv, says, capsys):
    assert main(["audit", *argv, "--head-dim", "16", "--trials", "2"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


def test_cli_fuzz_prints_a_reproducer_and_fails(capsys):
    code = main(["fuzz", "--impl", "planted:broken_tail", "--budget", "200",
                 "--max-elements", "20000"])
    out = capsys.readouterr().out
    assert code == 1
    argv = reproducer_argv(out)
    assert argv[0] == "check"
    assert main(argv) == 1  # the reproducer fails on its own


def test_audit_refuses_cuda_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"):
        audit("sdpa-cudnn", SMALL, trials=2, progress=False)


def test_dash_implementations_carry_their_bitwise_checks():
    from verify.impls import get_impl

    assert get_impl("dash:shift").bitwise is not None  # L1
    assert get_impl("dash-exact:shift").bitwise is not None  # L1 and L2
    assert get_impl("dash:atomic").bitwise is None  # no order to replay
    with pytest.raises(ValueError, match="deterministic schedule"):
        get_impl("dash-exact:atomic")


def test_sdpa_det_asks_for_strict_determinism(monkeypatch):
    """``sdpa-BACKEND-det`` runs with warn-only off, so a backend that has no deterministic
    kernel raises instead of silently running its non-deterministic one."""
    from verify.impls import get_impl

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 12, 2, 16, generator=gen) for _ in range(4))
    for name, want in (("sdpa-math-det", (True, False)), ("sdpa-math", (False, False))):
        seen.clear()
        get_impl(name).fn(q, k, v, do, True, 0.25)
        assert seen == [want], name
