"""Fuzz an attention implementation over shapes, and shrink a failure to a one-line reproducer.

:func:`check` runs one :class:`~verify.strategies.Case` through an implementation and
holds every output to the float64 reference within ``verify.highprec.error_bound``
(:func:`verify.reference.grad_checks`), requiring finite values, the right shapes and
dtypes, and, for implementations with an audit mode, L1: the fp32 dQ accumulator equals
``dash_ref.emulate.replay`` of the kernel's own partials bit for bit (and for
``dash-exact:NAME``, L2: the CPU emulation equals dQ, dK and dV bit for bit). :func:`fuzz` lets
``hypothesis`` draw cases, and when one fails, shrinks it to the smallest failing shape
and returns it with a ``dash-verify check`` command line that reproduces it.

What an implementation does wrong on a valid case (it raises, exits, hangs past the
timeout, or breaks the interface contract of :mod:`verify.contract`) is a finding, the
same as a wrong number: ``ok`` is false and ``kind`` says which. A timeout stops the fuzzer
at once (shrinking would call the hanging code again and again).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hypothesis import HealthCheck, given, reject, seed, settings
from hypothesis.errors import Unsatisfiable

from dash_ref._checks import integer
from dash_ref.arithmetic.steps import default_scale
from verify import guard
from verify.contract import ContractViolation, Finding, check_outputs, output_names
from verify.impls import Impl, call_keywords, get_impl
from verify.options import timeout_seconds
from verify.progress import progress_bar
from verify.reference import attention_f64, attention_f64_packed, grad_checks, packed_grad_checks
from verify.strategies import Case, cases, packed_cases

#: the smallest memory budget a fuzzing run accepts: q, k, v, dO of one head of d = 128
MIN_ELEMENTS = 4 * 128


#: what a failed check found: a wrong number, or a misbehaving implementation
KINDS = ("mismatch", "crash", "contract", "timeout")


@dataclass
class CheckResult:
    case: Case
    ok: bool
    errors: dict[str, float]
    message: str = ""
    kind: str = ""  # "" when ok, else one of KINDS


class CheckFailure(AssertionError):
    """A case on which an implementation disagrees with the reference."""


class _StopFuzzing(BaseException):
    """Ends a fuzzing run at once (hypothesis does not catch a BaseException)."""


def _kind(found: Finding) -> str:
    if isinstance(found, guard.TimedOut):
        return "timeout"
    return "contract" if isinstance(found, ContractViolation) else "crash"


def check(impl: Impl | str, case: Case, timeout: float | None = None) -> CheckResult:
    """Run one case and hold every output to the float64 reference and its bound.

    A crash, an exit, a call slower than ``timeout`` seconds or a broken interface
    contract is a finding (``ok`` false, ``kind`` and the message say which); an
    implementation that cannot run here raises :class:`~verify.impls.Unavailable`
    instead. The emulator runs the case's tiles; other implementations choose their own.
    A windowed case's ``window_size`` goes to the implementation and to the reference, and
    so do its ``softcap`` and ``learnable_sink`` (whose gradient ``dsink`` is then held to
    the reference's too); an implementation that takes no window
    (:attr:`~verify.impls.Impl.windows`) or not the case's features
    (:attr:`~verify.impls.Impl.features`) is refused (``ValueError``).
    """
    impl = get_impl(impl) if isinstance(impl, str) else impl
    if not isinstance(impl, Impl):
        raise TypeError(f"impl must be a name or a verify.impls.Impl, got "
                        f"{type(impl).__name__}")
    if not isinstance(case, Case):
        raise TypeError(f"case must be a verify.strategies.Case, got {type(case).__name__}")
    timeout = timeout_seconds(timeout)
    if impl.tiles is not None:
        impl = impl.with_tiles(case.problem.block_m, case.problem.block_n)
    impl.require_window(case.problem.window_size)
    impl.require_packed(case.problem.is_packed)
    impl.require_features(case.softcap, case.sink_tensor)
    impl.require_case(case)
    impl.require()
    q, k, v, do = case.tensors(impl.device)
    scale = default_scale(case.problem.head_dim)
    # only what the case has: without window and features, the six-argument calls
    asked = call_keywords(case, impl.device)
    sink = asked.get("learnable_sink")
    run = partial(impl, **asked)
    bitwise = None if impl.bitwise is None else partial(impl.bitwise, **asked)
    try:
        got = check_outputs(guard.call(run, q, k, v, do, case.causal, scale,
                                       timeout=timeout), q, k, v, do, sink)
        problems = (guard.call(bitwise, q, k, v, do, case.causal, scale,
                               timeout=timeout) if bitwise else [])
    except Finding as found:
        return CheckResult(case, False, {}, str(found), _kind(found))
    outputs = {name.lower(): x.detach().cpu()
               for name, x in zip(output_names(sink is not None), got)}
    errors = {}
    for where, checks in _reference_checks(case, (q, k, v, do), outputs, scale):
        for name, c in checks.items():
            errors[name] = max(errors.get(name, 0.0), c.normwise)
            if not c.finite:
                problems.append(f"{where}{name} has non-finite values")
            elif not c.ok:
                problems.append(f"{where}{name} error {c.error:.2e} > allowed "
                                f"{c.allowed:.2e} (normwise {c.normwise:.2e})")
    return CheckResult(case, not problems, errors, "; ".join(problems),
                       "" if not problems else "mismatch")


def _reference_checks(case: Case, inputs: tuple, outputs: dict, scale: float):
    """``[(where, grad_checks)]``: the outputs against the float64 reference, one entry for a
    rectangular case; for a packed one, one per sequence (``"sequence b: "``, on its own
    rows and bound) and, with sinks, ``dsink`` against the whole batch's (it sums over
    every sequence). Empty sequences have nothing to check."""
    p = case.problem
    q, k, v, do = (x.cpu() for x in inputs)
    if not p.is_packed:
        ref = attention_f64(q, k, v, do, case.causal, scale, window_size=p.window_size,
                            **case.features)
        return [("", grad_checks(outputs, ref, case.torch_dtype))]
    ref = attention_f64_packed(q, k, v, do, p.seqlens_q, p.seqlens_k, case.causal, scale,
                               window_size=p.window_size, **case.features)
    found = [(f"sequence {b}: ", c)
             for b, c in enumerate(packed_grad_checks(outputs, ref, case.torch_dtype))]
    if "dsink" in outputs:
        found.append(("", grad_checks({"dsink": outputs["dsink"]}, ref, case.torch_dtype)))
    return found


@dataclass
class FuzzResult:
    impl: str
    examples: int
    failure: CheckResult | None
    takes_tiles: bool = False  # the implementation runs the tiles the case asks for
    skipped: int = 0  # drawn cases outside the implementation's own limits (Impl.refuses)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def reproducer(self) -> str:
        """A one-line command that reruns the shrunk failing case."""
        if self.failure is None:
            return ""
        flags = self.failure.case.flags(tiles=self.takes_tiles)
        return f"dash-verify check --impl {self.impl} {flags}"


def recorded_schedule(impl: Impl) -> str:
    """The schedule recorded with every case of ``impl``: the one it runs
    (:attr:`~verify.impls.Impl.schedule`), ``naive`` for the peers, whose orders are their
    own."""
    return impl.schedule or "naive"


def fuzz(impl: Impl | str, budget: int = 100, max_elements: int = 20_000, rng_seed: int = 0,
         progress: bool = True, timeout: float | None = None, **case_kwargs) -> FuzzResult:
    """Draw up to ``budget`` cases; on a failure, shrink it and return the smallest one.

    ``max_elements`` bounds the numbers in ``q, k, v, dO`` together (at least
    :data:`MIN_ELEMENTS`, one small head); ``timeout`` bounds each call in seconds. An
    implementation that cannot run here raises :class:`~verify.impls.Unavailable` before
    any case is drawn. ``windows=True`` (passed on to :func:`verify.strategies.problems`)
    draws sliding windows too; an implementation that takes none is refused
    (``ValueError``) before any case is drawn; ``packed=True`` draws packed batches
    (:func:`verify.strategies.packed_cases`: heavy-tailed mixes with empty sequences and
    ``S_q != S_k`` per sequence; head dims 16 and 32 unless ``head_dims`` says otherwise),
    refused by an implementation that takes none; ``softcaps=True`` and ``sinks=True`` draw
    softcaps and learnable sinks as well (likewise refused by an implementation that takes
    none, :attr:`~verify.impls.Impl.features`). A drawn case outside the implementation's
    own limits (:meth:`~verify.impls.Impl.refuses`: a head dim a pinned ``dash-cute``
    does not run, say) is not run and not a finding: another is drawn, and
    :attr:`FuzzResult.skipped` counts them (shrinking's tries included); ``ValueError``
    when none of the drawn cases runs.
    """
    impl = get_impl(impl) if isinstance(impl, str) else impl
    if not isinstance(impl, Impl):
        raise TypeError(f"impl must be a name or a verify.impls.Impl, got "
                        f"{type(impl).__name__}")
    integer("budget", budget, minimum=1)
    integer("max_elements", max_elements, minimum=MIN_ELEMENTS)
    integer("rng_seed", rng_seed, minimum=0)
    timeout = timeout_seconds(timeout)
    packed = case_kwargs.pop("packed", False)
    if packed:
        impl.require_packed(True)
    if case_kwargs.get("windows") and not impl.windows:
        raise ValueError(impl.window_refusal("fuzzed with --windows"))
    for flag, feature in (("softcaps", "softcap"), ("sinks", "sinks")):
        if case_kwargs.get(flag):
            impl.require_feature(feature, f"fuzzed with --{flag}")
    impl.require()
    case_kwargs.setdefault("schedules", (recorded_schedule(impl),))
    bar = progress_bar(budget, f"fuzz {impl.name}", progress, unit="cases")
    state = {"examples": 0, "skipped": 0, "refusal": "", "last_failure": None}

    @seed(rng_seed)
    @settings(max_examples=budget, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(packed_cases(max_elements=max_elements, **{"head_dims": (16, 32)} | case_kwargs)
           if packed else cases(max_elements=max_elements, **case_kwargs))
    def run(case: Case) -> None:
        refusal = impl.refuses(case)
        if refusal:  # a call its own limits refuse says nothing of its bits: draw another
            state["skipped"] += 1
            state["refusal"] = refusal
            reject()
        state["examples"] += 1
        bar.update(1)
        result = check(impl, case, timeout)
        if not result.ok:
            state["last_failure"] = result
            if result.kind == "timeout":
                raise _StopFuzzing
            raise CheckFailure(result.message)

    try:
        run()
    except (CheckFailure, _StopFuzzing):
        pass
    except Unsatisfiable:  # every case drawn was refused: state says why, below
        pass
    finally:
        bar.close()
    if not state["examples"]:
        raise ValueError(f"{impl.name} runs none of the {state['skipped']} cases drawn: "
                         f"{state['refusal']}")
    # Hypothesis replays the shrunk example last, so the last failure seen is the smallest.
    return FuzzResult(impl.name, state["examples"], state["last_failure"],
                      impl.tiles is not None, state["skipped"])
