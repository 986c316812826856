"""Host microseconds of the primitives one forward + backward call is made of (a probe).

Each primitive runs in a loop of ``--calls`` with the GPU drained only at the end, so the
figure is the host's own time per call (the GPU work of these shapes is shorter); the
report keeps the least of ``--rounds`` such loops (a host shared with other work only ever
adds time to a loop)::

    python benchmarks/host_costs.py --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness import load_fa4, no_cuda
from host_overhead import SHAPES
from host_overhead import per_call_us as host_loop_us


def per_call_us(fn, n: int) -> float:
    """Host microseconds per call of ``fn`` after three untimed calls
    (:func:`host_overhead.per_call_us`, the GPU drained only at the end)."""
    for _ in range(3):
        fn()
    return host_loop_us(fn, n, synchronized=False)


def probes(shape, fa) -> dict:
    import torch

    import dash_cuda
    from dash_cuda import ops, prepost
    from dash_cuda.backends.cute import finish_dq as cute_finish
    from dash_cuda.options import Options

    b, s, h, d = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(*shape, device="cuda", generator=gen).bfloat16()
                   for _ in range(4))
    options = Options.checked(d, causal=True)
    o, lse = ops.forward_views(q, k, v, options)
    out = {}
    out["empty_like bf16"] = lambda: torch.empty_like(q)
    out["zeros fp32 dQacc"] = lambda: torch.zeros(b * h * (s // 64), 64 * d, device="cuda")
    out["zeros int32 sem"] = lambda: torch.zeros(b * h * (s // 64), device="cuda",
                                                 dtype=torch.int32)
    out["delta (preprocess_delta: triton_launch.launch)"] = lambda: prepost.preprocess_delta(
        o, do, 64, True)
    delta = prepost.preprocess_delta(o, do, 64, True)
    acc = torch.zeros(b * h * (s // 64), 64 * d, device="cuda")
    dq = torch.empty_like(q)
    if d == 128:
        out["finish_dq_tiles (triton_launch.launch)"] = lambda: cute_finish.finish_dq_tiles(
            acc, dq, 0.1, 64)
    compiled = prepost.dash_delta_kernel[(s // 64, b * h)](
        o, do, delta, *o.stride()[:3], *do.stride()[:3], *delta.stride(), h, s, None, 0, 0,
        BM=64, HEAD_DIM=d, PAIRWISE=True, CLEAR_BLOCK=1024, enable_fp_fusion=False)
    args = (o, do, delta, *o.stride()[:3], *do.stride()[:3], *delta.stride(), h, s, None, 0,
            0, 64, d, True, 1024)

    def direct():
        stream = torch.cuda.current_stream().cuda_stream
        compiled.run(s // 64, b * h, 1, stream, compiled.function, compiled.packed_metadata,
                     None, None, None, *args)
    out["delta (triton compiled.run)"] = direct
    out.update(plan_pieces(q, k, v, o, lse, do, options))
    out["forward_views"] = lambda: ops.forward_views(q, k, v, options)
    out["backward_views"] = lambda: ops.backward_views(q, k, v, o, lse, do, options)
    ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out["dash fwd+bwd (autograd)"] = lambda: torch.autograd.grad(
        dash_cuda.attention(ql, kl, vl, causal=True), (ql, kl, vl), do)
    out["dash forward (autograd, no grad taken)"] = lambda: dash_cuda.attention(
        ql, kl, vl, causal=True)

    class Trivial(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    out["trivial autograd.Function fwd+grad"] = lambda: torch.autograd.grad(
        Trivial.apply(ql, kl, vl), (ql, kl, vl), do)

    class Views(torch.autograd.Function):  # the trivial Function around the two views
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return ops.forward_views(q, k, v, options)[0]

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            o, lse = ops.forward_views(q, k, v, options)
            return ops.backward_views(q, k, v, o, lse, g, options)[:3]
    out["trivial Function, views inside (forward twice)"] = lambda: torch.autograd.grad(
        Views.apply(ql, kl, vl), (ql, kl, vl), do)
    out["EagerAttention fwd+grad (no api)"] = lambda: torch.autograd.grad(
        ops.EagerAttention.apply(ql, kl, vl, None, options), (ql, kl, vl), do)
    out["dash forward, no grad mode"] = lambda: _no_grad(dash_cuda.attention, ql, kl, vl)
    if fa is not None:
        out["fa4 fwd+bwd"] = lambda: torch.autograd.grad(
            fa(ql, kl, vl, causal=True)[0], (ql, kl, vl), do)
        out["fa4-det fwd+bwd"] = lambda: torch.autograd.grad(
            fa(ql, kl, vl, causal=True, deterministic=True)[0], (ql, kl, vl), do)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            y = torch.nn.functional.scaled_dot_product_attention(
                ql.transpose(1, 2), kl.transpose(1, 2), vl.transpose(1, 2), is_causal=True)
        torch.autograd.grad(y, (ql, kl, vl), do.transpose(1, 2))
    out["sdpa-cudnn fwd+bwd"] = cudnn
    return out


def _no_grad(fn, q, k, v):
    import torch

    with torch.no_grad():
        return fn(q, k, v, causal=True)


def plan_pieces(q, k, v, o, lse, do, options) -> dict:
    """The pieces of the plans' ``run`` one at a time: allocations, each bound launch, the
    stream query, and the whole ``run`` of each plan."""
    import torch

    from dash_cuda import ops, plans

    ops.backward_views(q, k, v, o, lse, do, options)  # the first call keeps the plan
    fwd = plans.lookup("forward", options, q, k, v)[0]
    bwd = plans.lookup("backward", options, q, k, v, o, lse, do)[0]
    if fwd is None or bwd is None:
        return {}
    device = q.device
    workspace = torch.empty(bwd.workspace, device=device, dtype=torch.float32)
    delta = torch.empty(bwd.delta_shape, device=device, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    at = workspace.data_ptr()
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), do.data_ptr(), lse.data_ptr(),
                delta.data_ptr(), at, dk.data_ptr(), dv.data_ptr(), at + bwd.sem_offset, at)
    pieces = {
        "plan: ForwardPlan.run": lambda: fwd.run(q, k, v),
        "plan: BackwardPlan.run": lambda: bwd.run(q, k, v, o, lse, do),
        "plan: raw_stream": lambda: plans.raw_stream(device.index),
        "plan: torch.empty workspace": lambda: torch.empty(bwd.workspace, device=device,
                                                           dtype=torch.float32),
        "plan: bound D launch": lambda: bwd.delta(o, do, delta, workspace),
        # the schedule's semaphores start at zero: D's launch zeroes them first
        "plan: bound D + schedule launches": lambda: (
            bwd.delta(o, do, delta, workspace),
            bwd.schedule(*pointers, plans.raw_stream(device.index))),
        "plan: bound finish_dq launch": lambda: bwd.finish_dq(workspace, dq),
    }
    if not fwd.counter:  # a counter's launch needs it zeroed per call: run measures that
        pieces["plan: forward kernel call"] = lambda: fwd.kernel(*fwd.template.fill(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), dq.data_ptr(), delta.data_ptr(), 0,
            plans.raw_stream(device.index)))
    return pieces


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if no_cuda("host_costs"):
        return 2
    fa = load_fa4()
    report = {}
    for shape in SHAPES:
        fns = probes(shape, fa)
        times = {name: [] for name in fns}
        failed = {}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                if name in failed:
                    continue
                try:
                    times[name].append(per_call_us(fn, args.calls))
                except Exception as exc:  # noqa: BLE001 - a probe that cannot run is reported
                    failed[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
        report[str(shape)] = {n: round(min(t), 1) if n not in failed
                              else failed[n] for n, t in times.items()}
        print(shape)
        for n, t in report[str(shape)].items():
            print(f"  {n:45s} {t:8.1f} us" if n not in failed else f"  {n:45s} failed: {t}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_costs.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
