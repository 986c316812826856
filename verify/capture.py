"""A proof a user can carry: one GPU run in one file, checked bit for bit on any CPU.

:func:`capture` runs ``dash_cuda``'s forward and audited backward on the GPU and keeps
everything L2 needs in one file: the inputs, ``O``, ``LSE2``, the gradients, the audit
record (``D``, every dQ partial, the accumulators), the schedule (name, workers, tiles and
fingerprint), the arithmetic the run used, and the environment (GPU, driver, library
versions). :func:`load` reads such a file back and refuses a bad or truncated one with
:class:`CaptureError`; :func:`check` recomputes every step on the CPU with ``dash_ref``
(:mod:`verify.l2`) and returns them beside the GPU's, in the order the run computed them:
``O``, ``LSE2``, ``D``, the partials, the accumulators, ``dQ``, ``dK``, ``dV`` (and
``dsink``). A run may have FlashAttention's other options: a packed batch (the offsets are
kept, and the tensors are ``(total, H, d)``), a sliding window, a value head dim of its own,
a softcap and learnable sinks (the sinks and their gradient are then kept too); files
written before these existed read as runs without them.

``dash-verify capture`` and ``dash-verify reproduce`` are the command-line front ends;
``tests/data/captures/`` holds H200 captures that the CPU test suite reproduces.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import lzma
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from dash_ref import Problem, build_schedule
from dash_ref.emulate import visit_index

from .l2 import Steps, forward_steps, l2_steps, visit_rows

FORMAT = "dash-capture/1"
TENSORS = ("q", "k", "v", "do", "o", "lse2", "dq", "dk", "dv", "delta", "partials", "dq_acc")
#: with one query head per KV head, also the fp32 per-head dK/dV accumulators
PER_HEAD = ("dk_heads", "dv_heads")
#: with learnable sinks, also the sinks and their gradient
SINKS = ("learnable_sink", "dsink")
#: a packed batch's offsets (int32, one more than its sequences)
OFFSETS = ("cu_seqlens_q", "cu_seqlens_k")
_MAGIC = b"DASHCAPTURE1\n"


class CaptureError(ValueError):
    """A file that is not a complete, consistent capture (one-line message)."""


@dataclass
class Capture:
    """One captured run: ``meta`` (plain values) and ``tensors`` (CPU tensors by name)."""

    meta: dict
    tensors: dict[str, torch.Tensor]

    @property
    def problem(self) -> Problem:
        m, t = self.meta, self.tensors
        window = m.get("window_size")
        options = dict(window_size=None if window is None else tuple(window),
                       head_dim_v=t["v"].shape[-1] if "v" in t else None)
        mask = "causal" if m["causal"] else "full"
        if "cu_seqlens_q" in t:
            _, h, d = t["q"].shape
            seqlens = [[b - a for a, b in zip(cu.tolist(), cu.tolist()[1:])]
                       for cu in (t["cu_seqlens_q"], t["cu_seqlens_k"])]
            return Problem.packed(*seqlens, h, t["k"].shape[1], d, mask, m["block_m"],
                                  m["block_n"], **options)
        b, s_q, h, d = t["q"].shape
        return Problem(b, h, t["k"].shape[2], s_q, t["k"].shape[1], d, mask, m["block_m"],
                       m["block_n"], **options)

    @property
    def softcap(self) -> float:
        """The run's softcap (0: none)."""
        return float(self.meta.get("softcap", 0.0))

    @property
    def learnable_sink(self) -> torch.Tensor | None:
        """The run's sink logits, ``(H,)`` (None: no sinks)."""
        return self.tensors.get("learnable_sink")

    def describe(self) -> str:
        """One line: shape, dtype, mask and options, schedule, backend, arithmetic, GPU."""
        p, m = self.problem, self.meta
        options = "".join([f" packed {p.seqlens_q} / {p.seqlens_k}" if p.is_packed else "",
                           f" d_v={p.head_dim_v}" if p.head_dim_v != p.head_dim else "",
                           f" window={p.window_size}" if p.is_windowed else "",
                           f" softcap={self.softcap:g}" if self.softcap else "",
                           " sinks" if self.learnable_sink is not None else ""])
        return (f"B={p.batch} S_q={p.seqlen_q} S_k={p.seqlen_k} H={p.heads} H_kv={p.heads_kv} "
                f"d={p.head_dim} {str(self.tensors['q'].dtype).removeprefix('torch.')} "
                f"{p.mask}{options} {m['schedule']} (W={m['num_workers']}) "
                f"backend={m['backend']} arithmetic={m['arithmetic']} on "
                f"{m['environment'].get('gpu', '?')}")


# -- on the GPU ----------------------------------------------------------------------------
def environment() -> dict:
    """GPU name, driver and library versions of this process (strings)."""
    env = {"torch": str(torch.__version__), "python": platform.python_version()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = str(torch.version.cuda)
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env["driver"] = "unknown"
    for module in ("triton", "cutlass", "dash_ref"):
        with contextlib.suppress(ImportError, AttributeError):
            env[module] = str(__import__(module).__version__)
    return env


def capture(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, *,
            causal: bool = False, softmax_scale: float | None = None,
            schedule: str = "auto", num_workers: int | None = None, backend: str = "cute",
            exact: bool = False, window_size: tuple[int, int] = (-1, -1),
            softcap: float = 0.0, learnable_sink: torch.Tensor | None = None,
            packing: dict | None = None) -> Capture:
    """Run the forward and the audited backward on ``q``'s GPU and capture everything.

    ``(B, S, H, d)`` CUDA tensors (``v`` and ``do`` may have a head dim of their own). The
    backward runs with ``audit=True`` (every dQ partial is kept; small problems only) in
    the backend's default arithmetic (``exact``: the Triton backend's ``exact=True``);
    every output and scratch buffer is filled with NaN first, so an element a kernel does
    not write shows. ``window_size``, ``softcap`` and ``learnable_sink`` are
    FlashAttention's, given to both passes; ``packing`` (``cu_seqlens_q``, ``cu_seqlens_k``,
    ``max_seqlen_q``, ``max_seqlen_k``) makes it a packed batch of ``(total, H, d)``
    tensors, run through ``attention_varlen_forward`` and ``attention_varlen_backward``.
    """
    from dash_cuda.backends import get_backend

    from .impls import audited_passes

    o, lse2, grads, rec = audited_passes(
        q, k, v, do, packing, causal=causal, softmax_scale=softmax_scale, backend=backend,
        window_size=tuple(window_size), softcap=softcap, learnable_sink=learnable_sink,
        schedule=schedule, num_workers=num_workers, exact=exact, _poison=True)
    if q.is_cuda:
        torch.cuda.synchronize(q.device)
    p = rec.schedule.problem
    tensors = {"q": q, "k": k, "v": v, "do": do, "o": o, "lse2": lse2, "dq": grads[0],
               "dk": grads[1], "dv": grads[2], "delta": rec.delta,
               "partials": _real_rows(rec.partials, rec.schedule), "dq_acc": rec.dq_acc}
    if p.heads == p.heads_kv:  # with GQA the emulator keeps only the heads' sums
        tensors.update(dk_heads=rec.dk_heads, dv_heads=rec.dv_heads)
    if learnable_sink is not None:
        tensors.update(learnable_sink=learnable_sink, dsink=grads[3])
    if packing is not None:
        tensors.update(cu_seqlens_q=packing["cu_seqlens_q"],
                       cu_seqlens_k=packing["cu_seqlens_k"])
    meta = {"format": FORMAT, "causal": bool(causal), "softmax_scale": softmax_scale,
            "window_size": None if p.window_size is None else list(p.window_size),
            "softcap": float(softcap),
            "schedule": rec.schedule.name, "num_workers": rec.schedule.num_workers,
            "fingerprint": rec.schedule.fingerprint(), "block_m": p.block_m,
            "block_n": p.block_n, "backend": rec.backend, "arithmetic": rec.arithmetic,
            "flush_subnormals": bool(rec.flush_subnormals),
            "forward_block_n": None if exact else get_backend(rec.backend).forward_block_n(
                p.head_dim),
            "environment": environment()}
    return Capture(meta, {n: t.detach().cpu().contiguous() for n, t in tensors.items()})


def _real_rows(partials: torch.Tensor, schedule) -> torch.Tensor:
    """The partials' rows that hold query rows (``(rows, d)``, visit by visit): a tile's rows
    past ``S_q`` hold anything and are not kept."""
    rows = visit_rows(schedule)
    return torch.cat([partials[n, :r] for n, r in enumerate(rows)]) if rows else partials[:0, 0]


# -- the file ------------------------------------------------------------------------------
def save(c: Capture, path: str | Path) -> None:
    """Write ``c`` to ``path``: a magic line, a SHA-256 of the payload, the payload (a
    ``torch.save`` of plain values and tensors, LZMA-compressed)."""
    buf = io.BytesIO()
    torch.save({"meta": c.meta, "tensors": c.tensors}, buf)
    payload = lzma.compress(buf.getvalue(), preset=6)
    Path(path).write_bytes(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n"
                           + payload)


def load(path: str | Path) -> Capture:
    """Read and validate a capture; :class:`CaptureError` says in one line what is wrong."""
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise CaptureError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not blob.startswith(_MAGIC):
        raise CaptureError(f"{path}: not a dash capture (no {FORMAT} header)")
    digest, _, payload = blob[len(_MAGIC):].partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CaptureError(f"{path}: truncated or corrupted (its checksum does not match)")
    try:
        data = torch.load(io.BytesIO(lzma.decompress(payload)), weights_only=True)
        meta, tensors = data["meta"], data["tensors"]
    except Exception as exc:  # noqa: BLE001 - any unreadable payload is the same finding
        raise CaptureError(f"{path}: unreadable payload ({type(exc).__name__})") from None
    if meta.get("format") != FORMAT:
        raise CaptureError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    missing = [n for n in TENSORS if n not in tensors]
    if "k" in tensors and "q" in tensors and tensors["k"].shape[-2] == tensors["q"].shape[-2]:
        missing += [n for n in PER_HEAD if n not in tensors]
    for group in (SINKS, OFFSETS):  # the sinks come with their gradient, offsets in pairs
        if any(n in tensors for n in group):
            missing += [n for n in group if n not in tensors]
    if missing:
        raise CaptureError(f"{path}: tensors missing: {', '.join(missing)}")
    c = Capture(meta, tensors)
    try:
        p = c.problem
    except (KeyError, ValueError, TypeError) as exc:
        raise CaptureError(f"{path}: inconsistent problem ({exc})") from None
    if meta.get("arithmetic") is None:
        raise CaptureError(f"{path}: the run's arithmetic ({meta.get('backend')} default) has "
                           "no CPU counterpart; capture a cute run or an exact=True run")
    _check_shapes(path, c, p)
    return c


def _check_shapes(path, c: Capture, p: Problem) -> None:
    t = c.tensors
    rows_q, rows_k = (((p.total_q,), (p.total_k,)) if p.is_packed
                      else ((p.batch, p.seqlen_q), (p.batch, p.seqlen_k)))
    want = {"k": (*rows_k, p.heads_kv, p.head_dim), "v": (*rows_k, p.heads_kv, p.head_dim_v),
            "do": (*rows_q, p.heads, p.head_dim_v), "dq": (*rows_q, p.heads, p.head_dim),
            "lse2": (*rows_q, p.heads), "delta": (*rows_q, p.heads),
            "dk_heads": (*rows_k, p.heads, p.head_dim),
            "dv_heads": (*rows_k, p.heads, p.head_dim_v),
            "learnable_sink": (p.heads,), "dsink": (p.heads,)}
    want["dk"], want["dv"] = want["k"], want["v"]
    want["o"], want["dq_acc"] = want["do"], want["dq"]
    for name, shape in want.items():
        if name in t and tuple(t[name].shape) != shape:
            raise CaptureError(f"{path}: {name} has shape {tuple(t[name].shape)}, the problem "
                               f"needs {shape}")


# -- on any CPU ----------------------------------------------------------------------------
def check(c: Capture) -> Steps:
    """Every step of the captured run: ``[(step, GPU value, CPU value)]``, in run order.

    Rebuilds the schedule from its name, workers and tiles (its fingerprint must equal the
    captured one), then the forward (:func:`verify.l2.forward_steps`) and the backward
    (:func:`verify.l2.l2_steps`) in the captured arithmetic, from the captured inputs and,
    for the backward, the captured ``O`` and ``LSE2``.
    """
    m, t = c.meta, c.tensors
    sched = build_schedule(c.problem, m["schedule"], m["num_workers"])
    if sched.fingerprint() != m["fingerprint"]:
        raise CaptureError("the schedule rebuilt on this machine has another fingerprint than "
                           "the captured one (a different dash_ref version?)")
    steps = []
    p = sched.problem
    features = dict(softcap=c.softcap, learnable_sink=c.learnable_sink)
    if m.get("forward_block_n") and m["arithmetic"] == "fast":
        steps += forward_steps((t["q"], t["k"], t["v"]), t["o"], t["lse2"], m["causal"],
                               m["softmax_scale"], m["forward_block_n"], m["arithmetic"],
                               window_size=p.window_size if p.is_windowed else (-1, -1),
                               seqlens=(p.seqlens_q, p.seqlens_k) if p.is_packed else None,
                               **features)
    kernel = {n: t[n] for n in ("delta", "dq_acc", "dq", "dk", "dv", "dsink") if n in t}
    # with GQA l2_steps compares the heads' sums only (dK, dV), never these
    kernel.update({n: t.get(n, torch.empty(0)) for n in PER_HEAD})
    kernel["partials"] = _padded(t["partials"], sched)
    inputs = tuple(t[n] for n in ("q", "k", "v", "o", "lse2", "do"))
    steps += l2_steps(sched, inputs, kernel, m["softmax_scale"], m["flush_subnormals"],
                      m["arithmetic"], **features)
    return steps


def _padded(rows: torch.Tensor, schedule) -> torch.Tensor:
    """The captured real rows back as ``(V, BM, d)`` (padding rows zero, never compared)."""
    p = schedule.problem
    out = torch.zeros(len(visit_index(schedule)), p.block_m, rows.shape[-1], dtype=rows.dtype)
    start = 0
    for n, r in enumerate(visit_rows(schedule)):
        if start + r > rows.shape[0]:
            raise CaptureError("the captured partials are fewer than the schedule's visits")
        out[n, :r] = rows[start:start + r]
        start += r
    if start != rows.shape[0]:
        raise CaptureError("the captured partials are more than the schedule's visits")
    return out
