"""Audit a determinism claim: run one attention many times on identical inputs, count the bits.

:func:`audit` runs forward + backward ``trials`` times on the same inputs and reports, for
each of O, dQ, dK, dV (and ``dsink``, the learnable sinks' gradient, when the audited call
has them), how many distinct bit patterns appeared, the largest distance (in
units in the last place) of any run from the first, where the first difference sits, and
how long the runs took. With ``perturb=True`` every run also varies what may legally vary
between two runs of a training job:

- ``busy stream`` (CUDA): a second stream keeps the GPU busy with matrix products while the
  audited call runs, so thread blocks are scheduled differently;
- ``fresh allocations``: inputs are copied to new memory behind a spacer of random size,
  so addresses (and alignment-dependent paths) differ;
- ``unrelated work``: a random amount of unrelated work is launched before the call.

A deterministic implementation gives one pattern per output however it is perturbed.

Every call is made through :func:`verify.guard.call` and its outputs held to the
interface contract (:mod:`verify.contract`) before they are hashed: an implementation
that crashes, exits, hangs past ``timeout`` or returns the wrong number, shapes, dtypes,
devices or non-finite values ends the audit with a finding (``failure``), never with a
verdict of ``DETERMINISTIC``.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from dash_ref import Problem
from dash_ref._checks import boolean, choice, integer
from dash_ref.arithmetic.numerics import ulp_distance
from verify import guard
from verify.contract import OUTPUTS, SINK_OUTPUT, Finding, check_outputs, output_names
from verify.impls import Impl, Unavailable, call_keywords, get_impl
from verify.options import softmax_scale_or_default, timeout_seconds
from verify.progress import progress_bar
from verify.strategies import DTYPES, Case

__all__ = ["OUTPUTS", "AuditReport", "OutputAudit", "audit"]


@dataclass
class OutputAudit:
    """What the trials produced for one output tensor."""

    name: str
    distinct: int = 1
    max_ulp_spread: int = 0  # over differing elements where neither value is a NaN
    nan_differences: int = 0  # differing elements where either value is a NaN
    first_trial: int | None = None  # first trial whose bits differ from trial 0
    first_index: tuple[int, ...] | None = None
    first_values: tuple[float, float] | None = None


@dataclass
class AuditReport:
    impl: str
    problem: Problem
    dtype: str
    trials: int
    perturbations: list[str]
    outputs: dict[str, OutputAudit]
    times_ms: list[float] = field(default_factory=list)
    note: str = ""
    failure: str = ""  # a finding that ended the audit early (crash, contract, timeout)
    tiles: tuple[int, int] | None = None  # (BM, BN) the implementation ran, where we chose
    softcap: float = 0.0  # the audited call's softcap (0: none)
    learnable_sink: tuple[float, ...] | None = None  # its sink logits, one per query head

    @property
    def deterministic(self) -> bool:
        """True when every trial kept the contract and each output had one bit pattern."""
        return not self.failure and all(o.distinct == 1 for o in self.outputs.values())

    @property
    def median_ms(self) -> float:
        t = sorted(self.times_ms)
        return t[len(t) // 2] if t else float("nan")

    def summary(self) -> str:
        p = self.problem
        verdict = ("DETERMINISTIC: one bit pattern per output" if self.deterministic
                   else f"FAILED: {self.failure}" if self.failure
                   else "NOT DETERMINISTIC: outputs changed between identical runs")
        lines = [
            f"audit of {self.impl}{f' ({self.note})' if self.note else ''}",
            f"  problem B={p.batch} H={p.heads} H_kv={p.heads_kv} S_q={p.seqlen_q} "
            f"S_k={p.seqlen_k} d={p.head_dim}"
            f"{f' d_v={p.head_dim_v}' if p.head_dim_v != p.head_dim else ''} mask={p.mask}"
            f"{f' window={p.window_size}' if p.is_windowed else ''}"
            f"{f' softcap={self.softcap:g}' if self.softcap else ''}"
            f"{' sinks' if self.learnable_sink is not None else ''} dtype={self.dtype}"
            f"{f' packed: {p.total_q} query and {p.total_k} key rows' if p.is_packed else ''}",
            f"  {self.trials} trials, perturbations: {', '.join(self.perturbations) or 'none'}",
        ]
        if self.times_ms:  # at least one trial kept the contract
            lines.append(f"  {'output':<7}{'distinct':>9}{'max ulp':>9}  first difference")
        for o in (self.outputs.values() if self.times_ms else ()):
            where = ("-" if o.first_trial is None else
                     f"trial {o.first_trial} at {_axes(o.name, p.is_packed)}"
                     f" = {o.first_index}: "
                     f"{o.first_values[0]!r} vs {o.first_values[1]!r}")
            spread = f"{o.max_ulp_spread}{'+NaN' if o.nan_differences else ''}"
            lines.append(f"  {o.name:<7}{o.distinct:>9}{spread:>9}  {where}")
        lines.append(f"  verdict: {verdict}")
        return "\n".join(lines)

    def timing(self) -> str:
        """How long the trials took (kept out of :meth:`summary`, which repeats exactly)."""
        return f"median {self.median_ms:.3f} ms per forward+backward over {self.trials} trials"

    def to_json(self) -> dict:
        out = asdict(self)
        out["problem"] = asdict(self.problem)
        out["deterministic"] = self.deterministic
        out["median_ms"] = self.median_ms
        return out


def _axes(name: str, packed: bool) -> str:
    """What an index of output ``name`` counts: ``dsink`` has one entry per query head."""
    if name == SINK_OUTPUT:
        return "(h,)"
    return "(t, h, d)" if packed else "(b, s, h, d)"


_HASH_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}


def _digest(x: torch.Tensor) -> tuple[int, ...]:
    """A 64-bit hash of the raw bits, computed where the tensor lives (no copy to the host).

    Two linear hashes with fixed random odd weights (wrapping int64 arithmetic): different
    bit patterns collide with probability about ``2**-64``.
    """
    x = x.detach().contiguous()
    bits = x.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
    bits = bits.reshape(-1).to(torch.int64)
    key = (bits.numel(), str(bits.device))
    if key not in _HASH_WEIGHTS:
        gen = torch.Generator().manual_seed(0x5EED)
        w = torch.randint(-(2**62), 2**62, (2, bits.numel()), generator=gen) | 1
        _HASH_WEIGHTS[key] = w.to(bits.device)
    w = _HASH_WEIGHTS[key]
    return (x.dtype.itemsize, *(int(v) for v in (bits * w).sum(dim=1).tolist()))


class _Perturber:
    """Makes each trial's surroundings differ (see the module docstring)."""

    def __init__(self, device: torch.device, enabled: bool, seed: int) -> None:
        self.device, self.enabled = device, enabled
        self.rng = random.Random(seed)
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if (enabled and self.cuda) else None
        n = 2048 if self.cuda else 64
        self.busy = torch.randn(n, n, device=device) if enabled else None
        self._keep: list[torch.Tensor] = []

    @property
    def names(self) -> list[str]:
        if not self.enabled:
            return []
        return (["busy stream"] if self.cuda else []) + ["fresh allocations", "unrelated work"]

    def before(self, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        if not self.enabled:
            return inputs
        for _ in range(self.rng.randrange(4)):  # unrelated work, in a varying amount
            self.busy @ self.busy
        if self.side is not None:  # keep the GPU busy while the audited call runs
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                for _ in range(8):
                    self.busy @ self.busy
        # A spacer of random size shifts where the fresh copies land.
        self._keep = [torch.empty(self.rng.randrange(1, 1 << 16), dtype=torch.uint8,
                                  device=self.device)]
        return tuple(x.clone() for x in inputs)

    def after(self) -> None:
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        self._keep = []


def audit(impl: Impl | str, problem: Problem, trials: int = 100, perturb: bool = True,
          dtype: str = "bf16", seed: int = 0, softmax_scale: float | None = None,
          device: str | None = None, progress: bool = True, timeout: float | None = None,
          tiles: tuple[int, int] | None = None, softcap: float = 0.0,
          learnable_sink: tuple[float, ...] | None = None) -> AuditReport:
    """Run ``impl`` ``trials`` times on one seeded input set and report how the bits varied.

    ``timeout`` bounds each call in seconds (a hang becomes a finding); ``tiles`` asks the
    implementation to run ``(BM, BN)`` tiles (the emulator does; others refuse). A
    windowed ``problem`` passes its ``window_size`` to every call, a packed one (with
    ``seqlens_q``, ``seqlens_k``) its offsets and longest lengths on ``(total, H, d)``
    inputs; an implementation that takes no window (:attr:`~verify.impls.Impl.windows`) or
    no packed batch (:attr:`~verify.impls.Impl.packed`) is refused. ``softcap`` (a
    positive cap) and ``learnable_sink`` (one logit per query head, as fp32) go to every
    call, whose fifth output ``dsink`` is then audited too; an implementation that takes
    neither (:attr:`~verify.impls.Impl.features`) is refused. Raises
    :class:`~verify.impls.Unavailable` when the implementation cannot run here, and
    ``ValueError``/``TypeError`` for bad arguments, before any trial runs. What the
    implementation does wrong on a call is a finding in the report (``failure``).
    """
    impl = get_impl(impl) if isinstance(impl, str) else impl
    if not isinstance(impl, Impl):
        raise TypeError(f"impl must be a name or a verify.impls.Impl, got "
                        f"{type(impl).__name__}")
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a dash_ref.Problem, got {type(problem).__name__}")
    if problem.seqlen_q == 0 or problem.seqlen_k == 0:
        raise ValueError(f"the problem has no attention to audit (seqlen_q="
                         f"{problem.seqlen_q}, seqlen_k={problem.seqlen_k}): both must be "
                         ">= 1")
    integer("trials", trials, minimum=2)
    choice("dtype", dtype, DTYPES)
    integer("seed", seed, minimum=0)
    boolean("perturb", perturb)
    boolean("progress", progress)
    timeout = timeout_seconds(timeout)
    if tiles is not None:
        impl = impl.with_tiles(*tiles)
    case = Case(problem, dtype, seed=seed, softcap=softcap, learnable_sink=learnable_sink)
    impl.require_window(problem.window_size)
    impl.require_packed(problem.is_packed)
    impl.require_features(case.softcap, case.sink_tensor)
    impl.require_case(case)
    dev = torch.device(device or impl.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise Unavailable(f"{impl.name} needs a CUDA device, and none is available")
    impl.require()
    asked = call_keywords(case, dev)
    sink = asked.get("learnable_sink")
    run = partial(impl, **asked)
    scale = softmax_scale_or_default(softmax_scale, problem.head_dim)
    inputs = case.tensors(dev)
    causal = problem.mask == "causal"
    perturber = _Perturber(dev, perturb, seed)
    names = output_names(sink is not None)
    outputs = {name: OutputAudit(name) for name in names}
    seen: dict[str, set[tuple[int, ...]]] = {name: set() for name in names}
    first: dict[str, torch.Tensor] = {}
    times: list[float] = []
    failure = ""
    bar = progress_bar(trials, f"audit {impl.name}", progress, unit="trials")
    for t in range(trials):
        args = perturber.before(inputs)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        try:
            result = check_outputs(guard.call(run, *args, causal, scale, timeout=timeout),
                                   *args, sink)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        except Finding as found:
            failure = f"trial {t}: {found}"
            break
        finally:
            perturber.after()
        times.append((time.perf_counter() - start) * 1e3)
        for name, x in zip(names, result):
            digest = _digest(x)
            if t == 0:
                first[name] = x.detach().clone()
            elif digest not in seen[name]:
                _record_difference(outputs[name], t, first[name], x.detach())
            seen[name].add(digest)
            outputs[name].distinct = len(seen[name])
        bar.update(1)
    bar.close()
    return AuditReport(impl.name, problem, dtype, trials, perturber.names, outputs, times,
                       impl.note, failure, impl.tiles, case.softcap, case.learnable_sink)


def _record_difference(out: OutputAudit, trial: int, ref: torch.Tensor, x: torch.Tensor
                       ) -> None:
    bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
    differ = ref.contiguous().view(bits) != x.contiguous().view(bits)
    if not differ.any():
        return
    a, b = ref[differ], x[differ]
    with_nan = a.isnan() | b.isnan()
    out.nan_differences += int(with_nan.sum())
    if not with_nan.all():
        spread = int(ulp_distance(a[~with_nan], b[~with_nan], x.dtype).max())
        out.max_ulp_spread = max(out.max_ulp_spread, spread)
    if out.first_trial is None:
        idx = tuple(int(i) for i in differ.nonzero()[0])
        out.first_trial, out.first_index = trial, idx
        out.first_values = (float(ref[idx]), float(x[idx]))
