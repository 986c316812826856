"""Attention implementations under audit, behind one signature.

An implementation is a callable ``fn(q, k, v, do, causal, softmax_scale) -> (o, dq, dk, dv)``
over ``(B, S, H, d)`` tensors (``k``/``v`` with ``H_kv`` heads, causal bottom-right). One
that takes FlashAttention's sliding window (:attr:`Impl.windows`) is also passed
``window_size=(left, right)`` (``-1``: unbounded on that side; under ``causal`` it is
``(left, 0)``) as a keyword, and only when the problem has a window, so a callable of six
arguments keeps working; asked for a window, one that does not take it is refused
(``ValueError``: ``dash-verify`` exits 2) rather than run without it. One that takes packed
batches (:attr:`Impl.packed`, FlashAttention's varlen layout) is called on ``(total, H, d)``
tensors with the keywords ``cu_seqlens_q``, ``cu_seqlens_k`` (int32, ``B + 1`` offsets),
``max_seqlen_q`` and ``max_seqlen_k``; the others are refused a packed problem. One that
takes FlashAttention's softcap and learnable sinks (:attr:`Impl.features`) is passed
``softcap=`` (a positive cap) and ``learnable_sink=`` (an fp32 ``(H,)`` tensor on the
inputs' device) only when the call has them, and with sinks returns their gradient as a
fifth output, ``(o, dq, dk, dv, dsink)`` (:mod:`verify.contract`); asked for a feature, one
that does not take it is refused like a window.
:func:`get_impl` resolves a name (the last column: whether it takes a window; those that do
take packed batches, softcaps and sinks too, ``dash_cuda.attention_varlen`` and
FlashAttention-4's ``flash_attn_varlen_func`` for the kernels):

=====================  ===============================================================  ======
name                   what runs                                                        window
=====================  ===============================================================  ======
``emulator:NAME``      ``dash_ref`` tile emulation under schedule NAME (``banded``       yes
                       too) or ``auto`` (CPU, 4 workers, 16 x 16 tiles unless
                       ``get_impl(..., tiles=(BM, BN))`` or ``Impl.with_tiles`` asks
                       for others); with ``atomic``, each call draws a fresh arrival
                       order, like real atomics (from a seeded stream, so a whole audit
                       repeats)
``sdpa-BACKEND``       PyTorch SDPA forward + autograd backward, BACKEND in ``math``,   no
                       ``efficient``, ``flash``, ``cudnn``; ``sdpa-BACKEND-det`` runs
                       it under strict ``torch.use_deterministic_algorithms(True)``
                       (not warn-only: a backend without a deterministic kernel raises)
``dash:NAME``          ``dash_cuda.attention`` with schedule NAME (``dash:atomic``: its  yes
                       non-deterministic peer; ``banded``: windows only) on the
                       backend ``auto`` picks; deterministic ones also carry an L1
                       check (audit mode against ``dash_ref.emulate.replay``);
                       ``dash-triton:NAME`` and ``dash-cute:NAME`` pin the backend
``dash-exact:NAME``    the same with ``exact=True``, checked at L1 and at L2 (the CPU   yes
                       emulation ``arithmetic="exact"`` against every output bit)
``fa4`` / ``fa4-det``  FlashAttention-4 (CuTe DSL) when importable, without / with      yes
                       ``deterministic=True`` (its window: None for ``-1``)
``module:function``    any importable user callable with the signature above; it takes  if set
                       windows where it sets ``fn.takes_window = True``, packed
                       batches where it sets ``fn.takes_packed = True``, a softcap
                       where ``fn.takes_softcap = True``, sinks where
                       ``fn.takes_sinks = True``
=====================  ===============================================================  ======

:meth:`Impl.unavailable` says why an implementation cannot run on this machine (no CUDA
device, a missing package); the audit, the fuzzer and the one-case check refuse to start
then (``dash-verify`` exits 2), rather than report the failure as a finding. Only the
emulator runs tiles the caller picks (:attr:`Impl.tiles`); the kernels and user callables
choose their own, and :meth:`Impl.with_tiles` refuses to pretend otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from dash_ref.arithmetic.steps import FEATURES as STEP_FEATURES

from . import guard

Outputs = tuple[torch.Tensor, ...]  # (o, dq, dk, dv), and dsink with sinks
AttentionFn = Callable[..., Outputs]


@dataclass
class Impl:
    """A named implementation and the device its inputs must live on."""

    name: str
    fn: AttentionFn
    device: str = "cpu"
    note: str = ""
    # bit-for-bit checks against dash_ref where the implementation has an audit mode (L1,
    # and L2 in exact mode): returns what disagrees, if anything
    bitwise: Callable[..., list[str]] | None = None

    # what this implementation needs that a machine may lack: a package to import
    needs: tuple[str, ...] = ()
    # the (BM, BN) tiles it runs where the caller picks them (the emulator), else None
    tiles: tuple[int, int] | None = None
    # takes window_size=(left, right) as a keyword (FlashAttention's sliding window)
    windows: bool = False
    # takes packed batches: cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k keywords
    packed: bool = False
    # the dash_ref schedule it runs (emulator:NAME, dash*:NAME; "auto" where the name gives
    # none), None for the peers, whose summation orders are their own
    schedule: str | None = None
    # FlashAttention's optional features it takes as keywords: "softcap" (softcap=) and
    # "sinks" (learnable_sink=, then returning dsink as a fifth output)
    features: tuple[str, ...] = ()
    # why its own limits refuse a verify.strategies.Case before any kernel runs (a head
    # dim, a dtype, a feature at a head dim), None where it runs it; None: no known limits
    limits: Callable[..., str | None] | None = None
    _make: Callable[[int, int], AttentionFn] | None = None

    def with_tiles(self, block_m: int, block_n: int) -> Impl:
        """This implementation running ``block_m x block_n`` tiles; ``ValueError`` where
        the implementation chooses its own tiles."""
        from dash_ref._checks import integer

        integer("block_m", block_m, minimum=1)
        integer("block_n", block_n, minimum=1)
        if self._make is None:
            raise ValueError(f"{self.name} chooses its own tiles; only emulator:NAME runs "
                             f"the tiles asked for (block_m={block_m}, block_n={block_n})")
        if (block_m, block_n) == self.tiles:
            return self
        return replace(self, fn=self._make(block_m, block_n), tiles=(block_m, block_n))

    def __call__(self, q, k, v, do, causal: bool, softmax_scale: float,
                 window_size: tuple[int, int] | None = None,
                 packing: dict | None = None, softcap: float = 0.0,
                 learnable_sink: torch.Tensor | None = None) -> Outputs:
        """Run the implementation; ``window_size`` only where the problem has a window
        (None: none), ``packing`` (the varlen keywords, :func:`packing_of`) only for a
        packed batch, ``softcap`` and ``learnable_sink`` only where set: without any the
        call is the six-argument one."""
        extra: dict = {}
        if window_size is not None:
            self.require_window(window_size)
            extra["window_size"] = tuple(window_size)
        if packing is not None:
            self.require_packed(True)
            extra.update(packing)
        self.require_features(softcap, learnable_sink)
        if softcap:
            extra["softcap"] = softcap
        if learnable_sink is not None:
            extra["learnable_sink"] = learnable_sink
        return self.fn(q, k, v, do, causal, softmax_scale, **extra)

    def require_features(self, softcap: float = 0.0,
                         learnable_sink: torch.Tensor | None = None) -> None:
        """``ValueError`` when a softcap (non-zero) or sinks (not None) are asked for and
        this implementation does not take them: it would run without them."""
        if softcap:
            self.require_feature("softcap", f"held to --softcap {softcap}")
        if learnable_sink is not None:
            self.require_feature("sinks", "given --learnable-sink")

    def require_feature(self, feature: str, asked: str) -> None:
        """``ValueError`` (one line) when ``feature`` (of :data:`FEATURES`), ``asked`` for
        as the message says, is not one this implementation takes."""
        if feature not in self.features:
            noun, attr = {"softcap": ("softcap", "takes_softcap"),
                          "sinks": ("learnable sinks", "takes_sinks")}[feature]
            raise ValueError(f"{self.name} takes no {noun}, so it cannot be {asked} (it "
                             "would run without it); emulator:NAME, dash:NAME, "
                             f"dash-exact:NAME, fa4[-det] and a module:function with {attr} "
                             "= True take it")

    def refuses(self, case) -> str | None:
        """Why this implementation's own limits refuse ``case`` (a
        :class:`verify.strategies.Case`), or None: such a call fails before any kernel runs,
        which says nothing of its bits."""
        return None if self.limits is None else self.limits(case)

    def require_case(self, case) -> None:
        """``ValueError`` (one line) when :meth:`refuses` has a reason: the audit and the
        check refuse the case as bad usage instead of reporting the refusal as a crash."""
        reason = self.refuses(case)
        if reason:
            raise ValueError(f"{self.name} cannot run this case: {reason}")

    def require_packed(self, packed: bool) -> None:
        """``ValueError`` when a packed batch is asked for and this implementation does
        not take one."""
        if packed and not self.packed:
            raise ValueError(f"{self.name} takes no packed batches (cu_seqlens), so it cannot "
                             "audit a packed problem; emulator:NAME, dash:NAME, "
                             "dash-exact:NAME, fa4[-det] and a module:function with "
                             "takes_packed = True take them")

    def require_window(self, window_size: tuple[int, int] | None) -> None:
        """``ValueError`` when a window is asked for (not None) and this implementation
        does not take one: it would run without it."""
        if window_size is not None and not self.windows:
            left, right = window_size
            raise ValueError(self.window_refusal(f"held to --window-size {left} {right}"))

    def window_refusal(self, asked: str) -> str:
        """The one-line refusal of a window this implementation does not take."""
        return (f"{self.name} takes no sliding window, so it cannot be {asked} (it would "
                "run without it); emulator:NAME, dash:NAME, dash-exact:NAME, fa4[-det] and "
                "a module:function with takes_window = True take one")

    def unavailable(self) -> str | None:
        """Why this implementation cannot run here, or None when it can."""
        if self.device == "cuda" and not torch.cuda.is_available():
            return f"{self.name} needs a CUDA device, and none is available"
        missing = [m for m in self.needs if importlib.util.find_spec(m) is None]
        if missing:
            return (f"{self.name} needs {', '.join(missing)}, which is not installed "
                    "(pip install 'dash-attention[gpu]')")
        return None

    def require(self) -> None:
        """Raise :class:`Unavailable` when this implementation cannot run here."""
        reason = self.unavailable()
        if reason:
            raise Unavailable(reason)


class Unavailable(RuntimeError):
    """An implementation cannot run on this machine (no CUDA device, a missing package)."""


EMULATOR_TILES = (16, 16)


def _emulator(schedule: str, block_m: int = 16, block_n: int = 16, workers: int = 4
              ) -> AttentionFn:
    from dash_ref import build_schedule
    from dash_ref.emulate import emulate, packed_problem_of, problem_of

    arrivals = random.Random(0)  # atomics: a fresh arrival order per call, the same per run

    def run(q, k, v, do, causal, softmax_scale, window_size=(-1, -1), cu_seqlens_q=None,
            cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, softcap=0.0,
            learnable_sink=None):
        head_dim_v = v.shape[-1]  # the values' own head dim, where they have one
        if cu_seqlens_q is None:
            p = problem_of(q, k, causal, block_m, block_n, window_size=window_size,
                           head_dim_v=head_dim_v)
        else:  # the lengths the offsets imply (max_seqlen is the longest of them)
            p = packed_problem_of(q, k, _seqlens(cu_seqlens_q), _seqlens(cu_seqlens_k), causal,
                                  block_m, block_n, window_size=window_size,
                                  head_dim_v=head_dim_v)
        sched = build_schedule(p, schedule, workers)
        seed = arrivals.randrange(2**31) if schedule == "atomic" else None
        fwd, bwd = emulate(sched, q, k, v, do, softmax_scale, arrival_seed=seed,
                           softcap=softcap, learnable_sink=learnable_sink)
        return (fwd.o, bwd.dq, bwd.dk, bwd.dv) + (() if bwd.dsink is None else (bwd.dsink,))

    return run


def _seqlens(cu_seqlens: torch.Tensor) -> list[int]:
    """Sequence lengths from ``B + 1`` offsets."""
    offsets = cu_seqlens.tolist()
    return [b - a for a, b in zip(offsets, offsets[1:])]


def call_keywords(case, device: torch.device | str) -> dict:
    """The keywords of a call of :class:`verify.strategies.Case` ``case`` on ``device``, only
    those it has (:meth:`Impl.__call__`'s and the bitwise checks'): ``window_size``,
    ``softcap``, ``learnable_sink`` (fp32 on ``device``) and ``packing``
    (:func:`packing_of`)."""
    p, sink = case.problem, case.sink_tensor
    return ({} if p.window_size is None else {"window_size": p.window_size}) | (
        {"softcap": case.softcap} if case.softcap else {}) | (
        {} if sink is None else {"learnable_sink": sink.to(device)}) | (
        {"packing": packing_of(p, device)} if p.is_packed else {})


def packing_of(problem, device: torch.device | str) -> dict:
    """The varlen keywords of a packed :class:`dash_ref.Problem`: int32 offsets on
    ``device`` and its longest lengths."""
    return dict(cu_seqlens_q=torch.tensor(problem.cu_seqlens_q, dtype=torch.int32,
                                          device=device),
                cu_seqlens_k=torch.tensor(problem.cu_seqlens_k, dtype=torch.int32,
                                          device=device),
                max_seqlen_q=problem.seqlen_q, max_seqlen_k=problem.seqlen_k)


def _sdpa(backend: str, deterministic: bool) -> AttentionFn:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def run(q, k, v, do, causal, softmax_scale):
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        kwargs: dict = {"scale": softmax_scale, "enable_gqa": q.shape[2] != k.shape[2]}
        if causal and q.shape[1] == k.shape[1]:
            kwargs["is_causal"] = True
        elif causal:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(q.shape[1], k.shape[1])
        previous = torch.are_deterministic_algorithms_enabled()
        # strict: warn-only would let a backend fall back to its non-deterministic kernel
        torch.use_deterministic_algorithms(deterministic, warn_only=False)
        try:
            with sdpa_kernel([chosen]):
                o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, **kwargs)
                o.backward(do.transpose(1, 2))
        finally:
            torch.use_deterministic_algorithms(previous)
        return (o.detach().transpose(1, 2), qt.grad.transpose(1, 2), kt.grad.transpose(1, 2),
                vt.grad.transpose(1, 2))

    return run


def _dash(schedule: str, exact: bool = False, backend: str = "auto") -> AttentionFn:
    import dash_cuda

    def run(q, k, v, do, causal, softmax_scale, window_size=(-1, -1), softcap=0.0,
            learnable_sink=None, **packing):
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        sink = _leaf(learnable_sink)
        options = dict(causal=causal, softmax_scale=softmax_scale,
                       schedule="naive" if schedule == "atomic" else schedule,
                       deterministic=schedule != "atomic", exact=exact, backend=backend,
                       window_size=tuple(window_size), softcap=softcap, learnable_sink=sink)
        if packing:  # cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k
            o = dash_cuda.attention_varlen(qg, kg, vg, **packing, **options)
        else:
            o = dash_cuda.attention(qg, kg, vg, **options)
        o.backward(do)
        return _grads(o, qg, kg, vg, sink)

    return run


def _dash_limits(backend: str, exact: bool, deterministic: bool) -> Callable[..., str | None]:
    """:attr:`Impl.limits` of a ``dash*`` implementation: ``dash_cuda``'s own answer
    (:func:`dash_cuda.backends.refusal`) for the call a case makes."""

    def limits(case) -> str | None:
        from dash_cuda.backends import Case as Call
        from dash_cuda.backends import refusal

        from .strategies import DTYPES

        p = case.problem
        call = Call(p.head_dim, DTYPES[case.dtype], exact, deterministic, p.is_packed,
                    p.window_size is not None, case.softcap > 0,
                    case.learnable_sink is not None,
                    None if p.head_dim_v == p.head_dim else p.head_dim_v)
        return refusal(backend, call)

    return limits


def audited_passes(q, k, v, do, packing: dict | None = None, **options) -> tuple:
    """``(o, lse2, grads, record)``: ``dash_cuda``'s forward and audited backward of one call
    (``attention_forward`` / ``attention_backward``, or their varlen forms where ``packing``
    holds the varlen keywords), every keyword of ``options`` given to both passes but the
    backward's own (``schedule``, ``num_workers``, ``exact``); ``grads`` is ``(dQ, dK, dV)``,
    and ``dsink`` with sinks."""
    import dash_cuda

    offsets = () if packing is None else tuple(packing[n] for n in (
        "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"))
    fwd = dash_cuda.attention_varlen_forward if packing else dash_cuda.attention_forward
    bwd = dash_cuda.attention_varlen_backward if packing else dash_cuda.attention_backward
    backward_only = ("schedule", "num_workers", "exact")
    o, lse2 = fwd(q, k, v, *offsets,
                  **{n: x for n, x in options.items() if n not in backward_only})
    *grads, rec = bwd(q, k, v, o, lse2, do, *offsets, audit=True, **options)
    return o, lse2, tuple(grads), rec


def _leaf(x: torch.Tensor | None) -> torch.Tensor | None:
    """A fresh leaf of ``x`` that takes a gradient (None stays None)."""
    return None if x is None else x.detach().clone().requires_grad_()


def _grads(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           sink: torch.Tensor | None) -> Outputs:
    """``(o, dq, dk, dv)`` after ``o.backward``, and ``dsink`` with sinks."""
    return (o.detach(), q.grad, k.grad, v.grad) + (() if sink is None else (sink.grad,))


def _dash_bitwise(schedule: str, exact: bool = False, backend: str = "auto"
                  ) -> Callable[..., list[str]]:
    """L1 checks of one audited backward against ``dash_ref``, and L2 where its record names an
    arithmetic ``dash_ref`` reproduces (``exact=True``; the CuTe backend's default, whose
    forward is then checked too)."""
    import dash_cuda
    from dash_cuda.backends import get_backend
    from dash_ref import Problem
    from dash_ref.emulate import epilogue, replay
    from verify.l2 import forward_steps, record_steps

    def checks(q, k, v, do, causal, softmax_scale, window_size=(-1, -1), softcap=0.0,
               learnable_sink=None, packing=None) -> list[str]:
        window_size = tuple(window_size)
        features = dict(softcap=softcap, learnable_sink=learnable_sink)
        o, lse, grads, rec = audited_passes(
            q, k, v, do, packing, causal=causal, softmax_scale=softmax_scale, backend=backend,
            window_size=window_size, schedule=schedule, exact=exact, **features)
        dq, ran = grads[0], rec.schedule.problem
        # the replay runs the record's schedule: it must be that of the problem asked for
        if packing:
            lengths = tuple(tuple(_seqlens(packing[n])) for n in ("cu_seqlens_q", "cu_seqlens_k"))
            want = Problem.packed(*lengths, q.shape[1], k.shape[1], q.shape[2],
                                  "causal" if causal else "full", ran.block_m, ran.block_n,
                                  window_size)
            if (ran.seqlens_q, ran.seqlens_k) != lengths:
                return [f"L1: the kernel's record ran lengths {ran.seqlens_q} / "
                        f"{ran.seqlens_k}, asked for {lengths[0]} / {lengths[1]}"]
        else:
            want = dash_cuda.backward_problem(q.shape[0], q.shape[2], k.shape[2], q.shape[1],
                                              k.shape[1], q.shape[3], causal, rec.backend,
                                              window_size=window_size)
        if ran.window_size != want.window_size:
            return [f"L1: the kernel's record ran window {ran.window_size}, "
                    f"asked for {want.window_size}"]
        acc = replay(rec.schedule, rec.partials.cpu(), flush_subnormals=rec.flush_subnormals)
        found = []
        if not torch.equal(rec.dq_acc.cpu(), acc):
            found.append("L1: the kernel's dQ accumulator differs from the replay")
        if not torch.equal(dq.cpu(), epilogue(acc, softmax_scale, q.dtype)):
            found.append("L1: dQ differs from the replay's epilogue")
        if rec.arithmetic is not None:  # L2: exact=True, or the CuTe default arithmetic
            steps = record_steps(rec, (q, k, v, o, lse, do), tuple(grads), softmax_scale,
                                 **features)
            if rec.arithmetic == "fast":
                steps = forward_steps((q.cpu(), k.cpu(), v.cpu()), o.cpu(), lse.cpu(), causal,
                                      softmax_scale, get_backend(rec.backend).forward_block_n(
                                          q.shape[-1]), window_size=window_size,
                                      seqlens=(ran.seqlens_q, ran.seqlens_k) if packing
                                      else None, **features) + steps
            found += [f"L2: {name} differs from the CPU emulation"
                      for name, got, want in steps if not torch.equal(got, want)]
        return found

    return checks


def load_fa4(varlen: bool = False) -> Callable | None:
    """FlashAttention-4's ``flash_attn_func`` (``varlen``: ``flash_attn_varlen_func``) if it
    is installed (``pip install flash-attn-4``, or on ``PYTHONPATH``, as
    ``scripts/gpu_release.sh`` puts the bundle of ``scripts/fa4_bundle.sh``), else None."""
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return flash_attn_varlen_func if varlen else flash_attn_func


def _fa4(deterministic: bool) -> AttentionFn:
    fa = load_fa4()
    if fa is None:
        raise Unavailable("FlashAttention-4 is not importable here: pip install "
                          "flash-attn-4, or put it on PYTHONPATH (scripts/fa4_bundle.sh packs "
                          "it for the GPU machine)")

    def run(q, k, v, do, causal, softmax_scale, window_size=None, softcap=0.0,
            learnable_sink=None, **packing):
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        sink = _leaf(learnable_sink)
        # FlashAttention-4 spells an unbounded side None, not -1
        window = {} if window_size is None else {
            "window_size": tuple(None if x < 0 else x for x in window_size)}
        call = load_fa4(varlen=True) if packing else fa
        out = call(qg, kg, vg, softmax_scale=softmax_scale, causal=causal,
                   deterministic=deterministic, softcap=softcap, learnable_sink=sink,
                   **window, **packing)
        o = out[0] if isinstance(out, tuple) else out
        o.backward(do)
        return _grads(o, qg, kg, vg, sink)

    return run


SDPA_BACKENDS = ("math", "efficient", "flash", "cudnn")
#: the optional features an implementation may take (:attr:`Impl.features`): the steps'
FEATURES = STEP_FEATURES
KINDS = ("emulator:NAME, dash[-triton|-cute]:NAME, dash-exact:NAME, sdpa-BACKEND[-det], "
         "fa4[-det], module:function")
DASH_KINDS = {"dash": ("auto", False), "dash-triton": ("triton", False),
              "dash-cute": ("cute", False), "dash-exact": ("auto", True)}


def _schedule_name(name: str, schedule: str) -> str:
    from dash_ref import BANDED, NAMES, RAGGED

    # every name a schedule builder takes; whether the call admits it (a ragged schedule on
    # a packed batch, a banded one with a window) is the implementation's own check
    known = (*NAMES, *RAGGED, *BANDED)
    if schedule != "auto" and schedule not in known:
        raise ValueError(f"unknown schedule {schedule!r} in implementation {name!r}; choose "
                         f"from auto, {', '.join(known)}")
    return schedule


def get_impl(name: str, tiles: tuple[int, int] | None = None) -> Impl:
    """Resolve an implementation name (see the module docstring); ``ValueError`` if unknown
    or if it cannot be loaded, and for ``tiles`` an implementation does not take."""
    impl = _resolve(name)
    return impl if tiles is None else impl.with_tiles(*tiles)


def _resolve(name: str) -> Impl:
    if not isinstance(name, str):
        raise TypeError(f"an implementation name must be a str, got {type(name).__name__}")
    kind, colon, arg = name.partition(":")
    if kind == "emulator":
        schedule = _schedule_name(name, arg)
        return Impl(name, _emulator(schedule, *EMULATOR_TILES), "cpu",
                    "tile-level emulation on the CPU", tiles=EMULATOR_TILES, windows=True,
                    packed=True, schedule=schedule, features=FEATURES,
                    _make=lambda bm, bn: _emulator(schedule, bm, bn))
    if kind in DASH_KINDS:
        backend, exact = DASH_KINDS[kind]
        schedule = _schedule_name(name, arg or "auto")
        if exact and schedule == "atomic":
            raise ValueError("dash-exact needs a deterministic schedule, not 'atomic'")
        needs = {"auto": ("triton",), "triton": ("triton",), "cute": ("triton", "cutlass")}
        return Impl(name, _dash(schedule, exact, backend), "cuda", needs=needs[backend],
                    windows=True, packed=True, schedule=schedule, features=FEATURES,
                    limits=_dash_limits(backend, exact, schedule != "atomic"),
                    bitwise=None if schedule == "atomic"
                    else _dash_bitwise(schedule, exact, backend))
    if name.startswith("sdpa-"):
        parts = name.split("-")
        backend, det = parts[1], parts[-1] == "det"
        if backend not in SDPA_BACKENDS or len(parts) > 3 or (len(parts) == 3 and not det):
            raise ValueError(f"unknown SDPA implementation {name!r}: use sdpa-BACKEND or "
                             f"sdpa-BACKEND-det with BACKEND in {', '.join(SDPA_BACKENDS)}")
        device = "cpu" if backend == "math" and not torch.cuda.is_available() else "cuda"
        note = "use_deterministic_algorithms(True), strict" if det else ""
        return Impl(name, _sdpa(backend, det), device, note)
    if name in ("fa4", "fa4-det"):
        return Impl(name, _fa4(name == "fa4-det"), "cuda", windows=True, packed=True,
                    features=FEATURES)
    if colon and kind and arg:
        try:  # importing runs user code: it may raise, exit or print
            module = guard.call(importlib.import_module, kind)
        except guard.Crash as exc:
            raise ValueError(f"implementation {name!r}: cannot import module {kind!r} "
                             f"({exc})") from exc
        fn = getattr(module, arg, None)
        if not callable(fn):
            raise ValueError(f"implementation {name!r}: module {kind!r} has no callable {arg!r}")
        return Impl(name, fn, "cuda" if torch.cuda.is_available() else "cpu", "user callable",
                    windows=getattr(fn, "takes_window", False) is True,
                    packed=getattr(fn, "takes_packed", False) is True,
                    features=tuple(f for f, attr in zip(FEATURES, ("takes_softcap", "takes_sinks"))
                                   if getattr(fn, attr, False) is True))
    raise ValueError(f"unknown implementation {name!r}: use {KINDS}")
