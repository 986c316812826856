"""Run the Triton kernels, through ``dash_cuda``'s own call path, in Triton's CPU interpreter.

``run(calls, folder, hopper=...)`` saves ``calls`` (dicts of CPU tensors and arguments),
runs them in a fresh process with ``TRITON_INTERPRET=1`` (the flag counts when the kernels
are defined) and returns them with their outputs. Each call names a public function of
``dash_cuda`` and runs through it: the checks, the options, the custom op's Python
functions or the eager autograd function, the launch, the schedule tables and the kernels.
What the interpreter needs to get there on CPU tensors is patched in that process only:

- ``torch.cuda.device`` is a no-op context and the public functions' CUDA check is skipped
  (every other check runs, on CPU tensors);
- the residency check takes the grid as it is: interpreted programs run one after
  another, so a persistent backward runs on ``num_workers=1`` (a program that waited for
  another would spin forever), and a call that names no worker count gets one;
- two gaps of the interpreter (Triton 3.6, NumPy 2.4): a scalar loaded from memory is a
  one-element array, which ``range`` cannot take, and ``libdevice.rint`` and
  ``libdevice.tanh`` (the softcap's) have no CPU body: NumPy's ``rint`` and fp32 ``tanh``
  stand in (``tanh`` within an ulp or so of the GPU's ``__nv_tanhf``, not its bits).

``hopper=True`` also gives the interpreter the GPU's rounding where the kernels' ``exact``
arithmetic depends on it: ``tl.dot`` by :func:`dash_ref.arithmetic.tensorcore.mma_bits`
(Hopper's fused k16 steps), and an addition of a fresh ``tl.dot`` into an accumulator as
one ``tl.dot`` with that accumulator (Triton's combine pass rewrites ``acc + dot(a, b)``
so on the GPU), ``tl.fma`` by :func:`dash_ref.arithmetic.numerics.fma_f32` (one rounding,
not two), and fp32 to bf16 by round to nearest even (the interpreter truncates). The
interpreter then computes what the compiled kernel computes, step by step, on the models
the GPU tests hold to the hardware; the dQ additions are NumPy's (subnormals kept, where
``red.add`` flushes them), so a comparison says whether subnormals occurred.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run(calls: list[dict], folder: Path, hopper: bool = False, timeout: float = 600) -> list[dict]:
    """``calls`` run in an interpreted process; each returned with ``"out"`` (see :func:`_call`)."""
    path = folder / "calls.pt"
    return _interpreted([__file__, str(path), "hopper" if hopper else "plain"], calls, path,
                        timeout)


def run_source(source: str, cases: list[dict], path: Path, timeout: float = 600
               ) -> list[dict]:
    """``cases`` through ``source``, a script that loads ``sys.argv[1]``, fills the cases
    in and saves them back, run in a fresh interpreted process (no patches but its own)."""
    return _interpreted(["-c", source, str(path)], cases, path, timeout)


def _interpreted(argv: list[str], cases: list[dict], path: Path, timeout: float) -> list[dict]:
    """``cases`` saved to ``path``, ``python argv`` with ``TRITON_INTERPRET=1`` (the flag
    counts when the kernels are defined, so in a fresh process), and the cases read back."""
    torch.save(cases, path)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)
    assert done.returncode == 0, done.stderr[-6000:]
    return torch.load(path)


# -- in the interpreted process ---------------------------------------------------------------
def _patch_interpreter() -> None:
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter
    from triton.language.extra import libdevice

    patch_tensor = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched

    def rint(x, **_):
        handle = interpreter.TensorHandle(np.rint(x.handle.data), x.handle.dtype.scalar)
        return tl.tensor(handle, x.type)

    def tanh(x, **_):
        handle = interpreter.TensorHandle(np.tanh(x.handle.data), x.handle.dtype.scalar)
        return tl.tensor(handle, x.type)

    libdevice.rint = rint
    libdevice.tanh = tanh


def _patch_hopper() -> None:
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    from dash_ref.arithmetic.numerics import fma_f32
    from dash_ref.arithmetic.tensorcore import HOPPER, K_STEP, mma_bits

    Builder, Handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
    formats = {tl.float16: "fp16", tl.bfloat16: "bf16"}

    def bits(h):
        return h.data.view(np.uint16) if h.dtype.scalar == tl.float16 else h.data

    def dot(a, b, c_bits):
        out = mma_bits(bits(a)[None], bits(b)[None], None if c_bits is None else c_bits[None],
                       formats[a.dtype.scalar], K_STEP, "ascending", HOPPER)
        return Handle(out[0].view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        fresh = not d.data.any() and not np.signbit(d.data).any()  # an accumulator of +0
        out = dot(a, b, None if fresh else d.data.view(np.uint32))
        if fresh:
            out.fresh_dot = (a, b)
        return out

    add = Builder.create_fadd

    def create_fadd(self, x, y):
        # Triton's combine pass: acc + dot(a, b) (fresh) is dot(a, b, acc), one fused sum
        for acc, product in ((x, y), (y, x)):
            operands = getattr(product, "fresh_dot", None)
            if operands is not None and acc.data.shape == product.data.shape:
                return dot(*operands, np.ascontiguousarray(acc.data).view(np.uint32))
        return add(self, x, y)

    def create_fma(self, x, y, z):
        x, y, z = (torch.from_numpy(np.ascontiguousarray(h.data, np.float32)) for h in (x, y, z))
        return Handle(fma_f32(x, y, z).numpy(), tl.float32)

    cast = Builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)
            return Handle(rounded.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    Builder.create_dot, Builder.create_fadd = create_dot, create_fadd
    Builder.create_fma, Builder.cast_impl = create_fma, cast_impl


def _patch_dash_cuda() -> None:
    import contextlib

    import dash_cuda.api
    import dash_cuda.checks
    import dash_cuda.launch

    torch.cuda.device = lambda device: contextlib.nullcontext()
    dash_cuda.api.check_cuda = dash_cuda.checks.check_cuda = lambda named: None
    dash_cuda.launch.max_workers = lambda backend, launch: launch.num_workers
    dash_cuda.launch.sm_count = lambda device: 1  # a call that names no workers runs on one


def _call(c: dict) -> dict:
    """One call of a public function on CPU tensors; its outputs as a dict.

    ``"attention_varlen"`` / ``"attention"``: ``o`` and, with ``do`` given, the gradients by
    autograd (``dq``, ``dk``, ``dv``; ``dsink`` with a ``learnable_sink`` among the
    keywords). ``"capture"``: :func:`verify.capture.capture` (``meta`` and ``tensors``).
    ``"check"``: :func:`verify.fuzz.check` of ``impl`` (its inputs on the CPU) on the case
    ``flags`` describe (``dash-verify check``'s; ``ok``, ``message``, ``kind``, ``errors``).
    ``"passes_varlen"`` / ``"passes"``: the two passes (``o``, ``lse``, ``dq``,
    ``dk``, ``dv``, ``dsink`` with sinks, and, with ``audit``, the record's ``partials``,
    ``dq_acc``, ``dk_heads``, ``dv_heads``, ``delta``), outputs poisoned with NaN first.
    """
    import dash_cuda

    if c["kind"] == "check":  # verify.fuzz.check of an implementation on a case
        import shlex
        from dataclasses import replace

        from verify.cli import build_parser
        from verify.cli.args import case_from_args
        from verify.fuzz import check
        from verify.impls import get_impl

        args = build_parser().parse_args(["check", "--impl", c["impl"],
                                          *shlex.split(c["flags"])])
        case = case_from_args(args)
        result = check(replace(get_impl(c["impl"]), device="cpu"), case)
        return {"ok": result.ok, "message": result.message, "kind": result.kind,
                "errors": result.errors}
    if c["kind"] == "capture":  # verify.capture.capture: the file's meta and tensors
        from verify.capture import capture

        got = capture(c["q"], c["k"], c["v"], c["do"], **c.get("kwargs", {}))
        return {"meta": got.meta, "tensors": got.tensors}
    kw = dict(c.get("kwargs", {}))
    q, k, v, do = c["q"], c["k"], c["v"], c.get("do")
    kind = c["kind"]
    packed = kind.endswith("varlen")
    offsets = (c["cu_seqlens_q"], c["cu_seqlens_k"], c["max_seqlen_q"], c["max_seqlen_k"]
               ) if packed else ()
    sink = kw.get("learnable_sink")
    if kind in ("attention_varlen", "attention"):
        leaves = [x.detach().clone().requires_grad_(do is not None) for x in (q, k, v)]
        if sink is not None:
            kw["learnable_sink"] = sink = sink.detach().clone().requires_grad_(do is not None)
        fn = dash_cuda.attention_varlen if packed else dash_cuda.attention
        o = fn(*leaves, *offsets, **kw)
        out = {"o": o.detach()}
        if do is not None:
            o.backward(do)
            out.update(dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
            if sink is not None:
                out["dsink"] = sink.grad
        return out
    fwd_kw = {n: kw[n] for n in ("causal", "window_size", "softmax_scale", "backend",
                                 "softcap", "learnable_sink") if n in kw}
    forward = dash_cuda.attention_varlen_forward if packed else dash_cuda.attention_forward
    o, lse = forward(q, k, v, *offsets, **fwd_kw, _poison=True)
    backward = dash_cuda.attention_varlen_backward if packed else dash_cuda.attention_backward
    audit = c.get("audit", False)
    got = backward(q, k, v, o, lse, do, *offsets, **kw, audit=audit, _poison=True)
    out = dict(o=o, lse=lse.contiguous(), dq=got[0], dk=got[1], dv=got[2])
    if sink is not None:
        out["dsink"] = got[3]
    if audit:
        record = got[-1]
        out.update({n: getattr(record, n) for n in ("partials", "dq_acc", "dk_heads",
                                                      "dv_heads", "delta")},
                   fingerprint=record.schedule.fingerprint(), exact=record.exact,
                   flush_subnormals=record.flush_subnormals)
    return out


def main(path: str, mode: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _patch_interpreter()
    if mode == "hopper":
        _patch_hopper()
    _patch_dash_cuda()
    calls = torch.load(path)
    for c in calls:
        c["out"] = _call(c)
    torch.save(calls, path)


if __name__ == "__main__":
    main(*sys.argv[1:])
