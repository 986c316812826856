"""Host time against GPU time of one ``dash_cuda.attention`` forward + backward call.

A training step of a small model launches many short kernels; if the host needs longer to
issue a call than the GPU needs to run it, the step is host-bound and kernel speed stops
mattering. This times, at one shape, (1) a call loop with the GPU left to drain only at the
end (host-issue time per call), (2) the same with a synchronize after every call, (3) where
the host time goes: the host time spent inside the main steps of the call path (each
wrapped in a timer, nested steps inside their callers), and ``cProfile``'s top functions
by own time::

    python benchmarks/host_overhead.py --out benchmarks/results

writes ``host_overhead.json`` and ``host_overhead.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import time
from pathlib import Path

from harness import no_cuda, provenance, save_report


def measure(shape: tuple[int, int, int, int], causal: bool, calls: int) -> dict:
    import torch

    import dash_cuda

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*shape, device="cuda", generator=gen).bfloat16().requires_grad_()
               for _ in range(3))
    do = torch.randn(*shape, device="cuda", generator=gen).bfloat16()

    def call():
        dash_cuda.attention(q, k, v, causal=causal).backward(do)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter() - start
    torch.cuda.synchronize()
    drained = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(calls):
        call()
        torch.cuda.synchronize()
    synced = time.perf_counter() - start
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    events[0].record()
    for _ in range(calls):
        call()
    events[1].record()
    torch.cuda.synchronize()
    steps = breakdown(call, calls)
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
    per = 1e6 / calls
    return {"shape_bshd": list(shape), "causal": causal, "calls": calls,
            "host_issue_us": issued * per, "host_and_gpu_us": drained * per,
            "synchronized_us": synced * per,
            "events_us": events[0].elapsed_time(events[1]) * 1e3 / calls,
            "steps_us": steps,
            "cprofile_top": text.getvalue()}


#: (module, function): the steps of the call path whose host time the breakdown reports
STEPS = [("dash_cuda.api", "check_tensors"), ("dash_cuda.ops", "attention_forward_impl"),
         ("dash_cuda.backends.cute.launch", "run_forward"),
         ("dash_cuda.ops", "attention_backward_impl"), ("dash_cuda.prepost", "preprocess_delta"),
         ("dash_cuda.backends.cute.launch", "run_schedule"),
         ("dash_cuda.backends.cute.launch", "pad_row_stats"),
         ("dash_cuda.backends.cute.finish_dq", "finish_dq_tiles")]


def breakdown(call, calls: int) -> dict[str, float]:
    """Host microseconds per call inside each of :data:`STEPS` and inside the CuTe kernel
    launches themselves (``kernel launches``); each step includes the steps it calls."""
    spent: dict[str, float] = {}

    def timer(label, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
        return timed

    saved = []
    for module_name, name in STEPS:
        module = importlib.import_module(module_name)
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, timer(name, getattr(module, name)))
    cute_launch = importlib.import_module("dash_cuda.backends.cute.launch")
    get_kernel = cute_launch.get_kernel
    saved.append((cute_launch, "get_kernel", get_kernel))
    cute_launch.get_kernel = lambda v: timer("kernel launches", get_kernel(v))
    try:
        for _ in range(calls):
            call()
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
    return {label: seconds * 1e6 / calls for label, seconds in spent.items()}


def markdown(r: dict) -> str:
    b, s, h, d = r["shape_bshd"]
    return "\n".join([
        f"# Host time of one forward + backward call (B={b}, S={s}, H={h}, d={d}, "
        f"{'causal' if r['causal'] else 'full'}, bf16)", "",
        f"`{r['command']}`; git {r['git_revision']}", "",
        "| measure | us per call |", "|---|---|",
        f"| host returns (GPU not awaited) | {r['host_issue_us']:.0f} |",
        f"| host + GPU drained | {r['host_and_gpu_us']:.0f} |",
        f"| synchronize after every call | {r['synchronized_us']:.0f} |",
        f"| CUDA events around the loop | {r['events_us']:.0f} |", "",
        "If the first row is close to the second, the loop is host-bound.", "",
        "Host time inside the steps of one call (each includes the steps it calls; the "
        "CuTe backend):", "",
        "| step | us per call |", "|---|---|",
        *[f"| `{name}` | {us:.0f} |" for name, us in r.get("steps_us", {}).items()], "",
        "```", r["cprofile_top"].strip(), "```", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--shape", type=int, nargs=4, default=[8, 2048, 12, 64],
                    metavar=("B", "S", "H", "D"), help="(B, S, H, d): the training example's")
    ap.add_argument("--full", action="store_true", help="full mask (default causal)")
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args(argv)
    if no_cuda("host_overhead"):
        return 2
    report = measure(tuple(args.shape), not args.full, args.calls)
    report.update(provenance("host_overhead.py", argv))
    save_report(args.out, "host_overhead", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
