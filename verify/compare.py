"""Bit-for-bit comparison of gradients, with a report a person can act on.

:func:`compare` says how many elements of two tensors differ in their bits, the largest
distance in units in the last place of their format, and where the first mismatch sits
(its ``(b, s, h, d)`` index). For dQ, when the fp32 partials are known,
:func:`dq_divergence` replays one element's accumulation under two schedules (or the same
schedule with two sets of partials) and names the step at which the running sums part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dash_ref.arithmetic.numerics import ulp_distance
from dash_ref.emulate import dq_add, visit_index
from dash_ref.schedules.schedule import Schedule


@dataclass
class TensorDiff:
    """Bitwise difference of two tensors of one dtype and shape."""

    name: str
    dtype: torch.dtype
    total: int
    differing: int
    max_ulp: int | None  # over the differing pairs without a NaN; None if every pair has one
    first_index: tuple[int, ...] | None = None
    first_values: tuple[float, float] | None = None
    nan: int = 0  # differing pairs in which either value is a NaN

    @property
    def equal(self) -> bool:
        return self.differing == 0

    def __str__(self) -> str:
        if self.equal:
            return f"{self.name}: bitwise equal ({self.total} elements)"
        a, b = self.first_values or (float("nan"), float("nan"))
        nan = f", {self.nan} of them with a NaN" if self.nan else ""
        distance = ("NaN (no pair without one)" if self.max_ulp is None
                    else f"{self.max_ulp} ulp ({_short(self.dtype)})")
        return (f"{self.name}: {self.differing} of {self.total} elements differ{nan}, "
                f"largest distance {distance}; first at (b, s, h, d) = "
                f"{self.first_index}: {a!r} vs {b!r}")


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
         torch.float64: torch.int64}


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(_BITS[x.dtype])


def compare(name: str, a: torch.Tensor, b: torch.Tensor) -> TensorDiff:
    """Compare two tensors bit for bit (``-0.0`` and ``+0.0`` count as different bits)."""
    for x in (a, b):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: compare takes torch.Tensors, got {type(x).__name__}")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"{name}: cannot compare {tuple(a.shape)} {a.dtype} with "
                         f"{tuple(b.shape)} {b.dtype}")
    if a.dtype not in _BITS:
        raise TypeError(f"{name}: compare takes floating-point tensors ("
                        f"{', '.join(_short(d) for d in _BITS)}), got {_short(a.dtype)}")
    a, b = a.detach().cpu(), b.detach().cpu()
    differ = _bits(a) != _bits(b)
    count = int(differ.sum())
    if count == 0:
        return TensorDiff(name, a.dtype, a.numel(), 0, 0)
    first = tuple(int(x) for x in differ.nonzero()[0])
    x, y = a[differ], b[differ]
    with_nan = x.isnan() | y.isnan()
    if a.dtype == torch.float64:  # no ulp model for float64: the distance is left out
        largest = None
    else:
        finite_pairs = ulp_distance(x[~with_nan], y[~with_nan], a.dtype)
        largest = int(finite_pairs.max()) if finite_pairs.numel() else None
    return TensorDiff(name, a.dtype, a.numel(), count, largest, first,
                      (float(a[first]), float(b[first])), int(with_nan.sum()))


@dataclass
class Step:
    """One fp32 addition in the accumulation of a dQ element."""

    j: int
    partial: float
    running: float


@dataclass
class Divergence:
    """Where two accumulations of one dQ element part ways."""

    element: tuple[int, int, int, int]  # (b, s, h, d)
    tile: tuple[int, int, int]  # (b, h, i)
    step: int | None  # first step whose running sums differ in bits; None if never
    steps_a: list[Step] = field(default_factory=list)
    steps_b: list[Step] = field(default_factory=list)
    labels: tuple[str, str] = ("a", "b")

    def table(self) -> str:
        """The two running sums side by side, the step where they part marked with ``<``."""
        la, lb = self.labels
        lines = [f"dQ{self.element} in tile (b, h, i) = {self.tile}: running fp32 sums",
                 f"  {'step':>4}  {la + ' j':>6}  {la + ' running sum':>28}  "
                 f"{lb + ' j':>6}  {lb + ' running sum':>28}"]
        for k, (sa, sb) in enumerate(zip(self.steps_a, self.steps_b)):
            mark = "  <- part here" if k == self.step else ""
            lines.append(f"  {k:>4}  {sa.j:>6}  {_fmt(sa.running):>28}  "
                         f"{sb.j:>6}  {_fmt(sb.running):>28}{mark}")
        return "\n".join(lines)


def _fmt(x: float) -> str:
    bits = torch.tensor([x], dtype=torch.float32).view(torch.int32).item() & 0xFFFFFFFF
    return f"{x: .9e} [{bits:08x}]"


def trace_dq(schedule: Schedule, partials: torch.Tensor, element: tuple[int, int, int, int],
             order: tuple[int, ...] | None = None) -> list[Step]:
    """The fp32 running sum of one dQacc element, one step per partial, in dQ order."""
    p = schedule.problem
    b, s, h, d = element
    i = s // p.block_m
    order = order if order is not None else schedule.dq_order(b, h, i)
    if order is None:
        raise ValueError(f"schedule {schedule.name!r} has no fixed dQ order; pass one")
    index = visit_index(schedule)
    acc = torch.zeros((), dtype=torch.float32)
    steps = []
    for j in order:
        part = partials[index[(b, h, i, j)], s - i * p.block_m, d]
        acc = dq_add(acc, part)
        steps.append(Step(j, float(part), float(acc)))
    return steps


def dq_divergence(schedule_a: Schedule, partials_a: torch.Tensor, schedule_b: Schedule,
                  partials_b: torch.Tensor, element: tuple[int, int, int, int],
                  labels: tuple[str, str] = ("a", "b")) -> Divergence:
    """Replay one dQ element under two (schedule, partials) pairs and find where they part."""
    steps_a = trace_dq(schedule_a, partials_a, element)
    steps_b = trace_dq(schedule_b, partials_b, element)
    step = next((k for k, (x, y) in enumerate(zip(steps_a, steps_b))
                 if _bits(torch.tensor([x.running])) != _bits(torch.tensor([y.running]))), None)
    b, s, h, _ = element
    return Divergence(element, (b, h, s // schedule_a.problem.block_m), step, steps_a, steps_b,
                      labels)


def first_dq_mismatch(dq_a: torch.Tensor, dq_b: torch.Tensor
                      ) -> tuple[int, int, int, int] | None:
    """The ``(b, s, h, d)`` index of the first element whose bits differ, or ``None``."""
    differ = (_bits(dq_a.detach().cpu()) != _bits(dq_b.detach().cpu())).nonzero()
    return tuple(int(x) for x in differ[0]) if len(differ) else None
