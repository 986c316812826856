"""A call an implementation's own limits refuse is bad usage, never a finding.

``dash_cuda`` refuses some calls before any kernel runs: a pinned backend asked for a head
dim, a dtype or a feature at a head dim it does not run. The backends answer that without
running (:func:`dash_cuda.backends.refusal`, what :func:`~dash_cuda.backends.choose_backend`
raises beside what is not installed), so the verifier asks first: ``audit`` and ``check``
refuse such a case with exit 2 and the backend's reason in one line (they reported it as a
crash, exit 1), and ``fuzz`` draws another case instead, counting those it skips.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from dash_cuda.backends import BACKENDS, Case, get_backend, refusal
from dash_ref import Problem
from verify.audit import audit
from verify.cli import main
from verify.fuzz import fuzz
from verify.impls import get_impl
from verify.strategies import Case as DrawnCase

BF16 = torch.bfloat16


def _calls():
    """Calls across what the backends' limits look at."""
    for d, dv, dtype, exact, packed, window, softcap, sink in itertools.product(
            (16, 64, 128, 192, 48), (None, 128), (BF16, torch.float16, torch.float32),
            (False, True), (False, True), (False, True), (False, True), (False, True)):
        yield Case(d, dtype, exact, True, packed, window, softcap, sink, dv)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_backends_refusal_is_its_limit_and_names_it(name):
    backend = get_backend(name)
    for case in _calls():
        reason = refusal(name, case)
        limited = (backend.unsupported(case) is not None
                   or (case.softcap and "softcap" not in backend.features)
                   or (case.sink and "sinks" not in backend.features))
        assert (reason is not None) == bool(limited), case
        if reason:
            assert reason.startswith(f"backend {name!r} cannot run this call: ")
            assert "\n" not in reason


def test_auto_refuses_only_what_every_backend_refuses():
    for case in _calls():
        every = all(refusal(name, case) for name in BACKENDS)
        assert (refusal("auto", case) is not None) == every, case
    # the CuTe kernels take softcap at 96 and 128 only; auto routes 64 to Triton
    capped = Case(64, BF16, False, True, softcap=True)
    assert "softcap at head dim 64" in refusal("cute", capped)
    assert refusal("auto", capped) is None
    assert refusal("auto", Case(48, BF16, False, True)).startswith("no backend can run")


def _drawn(head_dim: int, softcap: float = 0.0) -> DrawnCase:
    return DrawnCase(Problem(1, 2, 2, 40, 50, head_dim, "causal", 64, 128),
                     softcap=softcap)


def test_dash_implementations_know_their_backends_limits():
    assert "softcap at head dim 64" in get_impl("dash-cute:shift").refuses(_drawn(64, 20.0))
    assert get_impl("dash:shift").refuses(_drawn(64, 20.0)) is None  # auto: Triton
    assert "head dim 16" in get_impl("dash-cute").refuses(_drawn(16))
    assert get_impl("dash-triton").refuses(_drawn(16)) is None
    assert "exact=True" not in (get_impl("dash-exact").refuses(_drawn(64)) or "")
    assert get_impl("emulator:shift").refuses(_drawn(16)) is None  # no limits of its own


def test_audit_refuses_a_case_the_pinned_backend_cannot_run():
    problem = Problem(1, 2, 2, 40, 50, 64, "causal", 64, 128)
    with pytest.raises(ValueError, match="dash-cute:shift cannot run this case: backend "
                                         "'cute' cannot run this call: softcap at head dim 64"):
        audit("dash-cute:shift", problem, trials=2, softcap=20.0, progress=False)


@pytest.mark.parametrize("command", ["audit", "check"])
def test_the_cli_exits_2_with_the_backends_reason(capsys, command):
    # without the refusal these reached the run (here: no CUDA device, exit 2 for that
    # reason; on a GPU the backend's ValueError inside the call, a crash finding, exit 1)
    argv = [command, "--impl", "dash-cute:shift", "--seqlen-q", "40", "--seqlen-k", "50",
            "--heads", "2", "--head-dim", "64", "--mask", "causal", "--softcap", "20"]
    if command == "audit":
        argv += ["--trials", "2"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "cannot run this case" in lines[0] and "softcap at head dim 64" in lines[0]
    assert "CUDA" not in err


def _limited_emulator(refused_dims: tuple[int, ...], seen: list[int]):
    """The emulator with limits of its own: it refuses ``refused_dims`` (and records the
    head dim of every call it runs)."""
    impl = get_impl("emulator:shift")
    inner = impl.fn

    def run(q, k, v, do, causal, softmax_scale, **kw):
        seen.append(q.shape[-1])
        return inner(q, k, v, do, causal, softmax_scale, **kw)

    def limits(case):
        d = case.problem.head_dim
        return f"head dim {d} (supported: not {refused_dims})" if d in refused_dims else None

    return replace(impl, fn=run, limits=limits)


def test_fuzz_skips_the_cases_an_implementation_refuses():
    torch.set_num_threads(1)
    seen: list[int] = []
    result = fuzz(_limited_emulator((16,), seen), budget=6, max_elements=3000,
                  progress=False, head_dims=(16, 32))
    assert result.ok, result.failure
    assert result.examples >= 1 and result.skipped >= 1
    assert seen and set(seen) == {32}  # no refused case reached the implementation


def test_fuzz_with_nothing_it_can_run_is_refused():
    seen: list[int] = []
    with pytest.raises(ValueError, match="runs none of the .* cases drawn: head dim 16"):
        fuzz(_limited_emulator((16,), seen), budget=3, max_elements=3000, progress=False,
             head_dims=(16,))
    assert seen == []
