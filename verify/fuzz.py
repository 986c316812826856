"""Fuzz an attention implementation over shapes, and shrink a failure to a one-line reproducer.

:func:`check` runs one :class:`~verify.strategies.Case` through an implementation and
holds every output to the float64 reference within ``verify.highprec.error_bound``
(:func:`verify.reference.grad_checks`), requiring finite values, the right shapes and
dtypes, and, for implementations with an audit mode, L1: the fp32 dQ accumulator equals
``dash_ref.emulate.replay`` of the kernel's own partials bit for bit (and for
``dash-exact:NAME``, L2: the CPU emulation equals dQ, dK and dV bit for bit). :func:`fuzz` lets
``hypothesis`` draw cases, and when one fails, shrinks it to the smallest failing shape
and returns it with a ``dash-verify check`` command line that reproduces it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, seed, settings

from dash_ref._checks import integer
from dash_ref.arithmetic.steps import default_scale
from verify.audit import OUTPUTS
from verify.impls import Impl, get_impl
from verify.progress import progress_bar
from verify.reference import attention_f64, grad_checks
from verify.strategies import Case, cases

#: the smallest memory budget a fuzzing run accepts: q, k, v, dO of one head of d = 128
MIN_ELEMENTS = 4 * 128


@dataclass
class CheckResult:
    case: Case
    ok: bool
    errors: dict[str, float]
    message: str = ""


class CheckFailure(AssertionError):
    """A case on which an implementation disagrees with the reference."""


def check(impl: Impl | str, case: Case) -> CheckResult:
    """Run one case and hold every output to the float64 reference and its bound.

    A crash of the implementation is a finding (``ok`` false, the message says what it
    raised); an implementation that cannot run here raises
    :class:`~verify.impls.Unavailable` instead.
    """
    impl = get_impl(impl) if isinstance(impl, str) else impl
    if not isinstance(case, Case):
        raise TypeError(f"case must be a verify.strategies.Case, got {type(case).__name__}")
    impl.require()
    q, k, v, do = case.tensors(impl.device)
    scale = default_scale(case.problem.head_dim)
    try:
        got = tuple(impl(q, k, v, do, case.causal, scale))
        problems = impl.bitwise(q, k, v, do, case.causal, scale) if impl.bitwise else []
    except Exception as exc:  # noqa: BLE001 - a crash on a valid case is a finding
        return CheckResult(case, False, {}, f"raised {type(exc).__name__}: {exc}")
    if len(got) != len(OUTPUTS) or not all(isinstance(x, torch.Tensor) for x in got):
        return CheckResult(case, False, {}, "returned something other than the tensors "
                           f"{', '.join(OUTPUTS)}")
    ref = attention_f64(q.cpu(), k.cpu(), v.cpu(), do.cpu(), case.causal, scale)
    errors = {}
    outputs = {}
    for name, x, want in zip(OUTPUTS, got, (ref.o, ref.dq, ref.dk, ref.dv)):
        if tuple(x.shape) != tuple(want.shape) or x.dtype != case.torch_dtype:
            problems.append(f"{name} is {tuple(x.shape)} {x.dtype}, expected "
                            f"{tuple(want.shape)} {case.torch_dtype}")
        else:
            outputs[name.lower()] = x.detach().cpu()
    for name, c in grad_checks(outputs, ref, case.torch_dtype).items():
        errors[name] = c.normwise
        if not c.finite:
            problems.append(f"{name} has non-finite values")
        elif not c.ok:
            problems.append(f"{name} error {c.error:.2e} > allowed {c.allowed:.2e} "
                            f"(normwise {c.normwise:.2e})")
    return CheckResult(case, not problems, errors, "; ".join(problems))


@dataclass
class FuzzResult:
    impl: str
    examples: int
    failure: CheckResult | None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def reproducer(self) -> str:
        """A one-line command that reruns the shrunk failing case."""
        if self.failure is None:
            return ""
        return f"dash-verify check --impl {self.impl} {self.failure.case.flags()}"


def fuzz(impl: Impl | str, budget: int = 100, max_elements: int = 20_000, rng_seed: int = 0,
         progress: bool = True, **case_kwargs) -> FuzzResult:
    """Draw up to ``budget`` cases; on a failure, shrink it and return the smallest one.

    ``max_elements`` bounds the numbers in ``q, k, v, dO`` together (at least
    :data:`MIN_ELEMENTS`, one small head). An implementation that cannot run here raises
    :class:`~verify.impls.Unavailable` before any case is drawn.
    """
    impl = get_impl(impl) if isinstance(impl, str) else impl
    integer("budget", budget, minimum=1)
    integer("max_elements", max_elements, minimum=MIN_ELEMENTS)
    integer("rng_seed", rng_seed)
    impl.require()
    # the implementation fixes the schedule; record that one with every case
    kind, _, named = impl.name.partition(":")
    case_kwargs.setdefault("schedules", (named if kind in ("emulator", "dash") else "naive",))
    bar = progress_bar(budget, f"fuzz {impl.name}", progress)
    state = {"examples": 0, "last_failure": None}

    @seed(rng_seed)
    @settings(max_examples=budget, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(cases(max_elements=max_elements, **case_kwargs))
    def run(case: Case) -> None:
        state["examples"] += 1
        bar.update(1)
        try:
            result = check(impl, case)
        except Exception as exc:  # a crash is a finding too
            result = CheckResult(case, False, {}, f"raised {type(exc).__name__}: {exc}")
        if not result.ok:
            state["last_failure"] = result
            raise CheckFailure(result.message)

    try:
        run()
    except CheckFailure:
        pass
    finally:
        bar.close()
    # Hypothesis replays the shrunk example last, so the last failure seen is the smallest.
    return FuzzResult(impl.name, state["examples"], state["last_failure"])
