"""Host time of one attention forward + backward call: ``dash_cuda`` beside its peers.

A training step of a small model launches many short kernels; if the host needs longer to
issue a call than the GPU needs to run it, the step is host-bound and kernel speed stops
mattering. At each shape (default: the two of the host-path issue, causal, bf16) every
implementation runs the same call, ``out = f(q, k, v)`` on leaves that require gradients,
then ``torch.autograd.grad(out, (q, k, v), dO)``, and is timed the same way, in interleaved
rounds (the order rotates each round; medians over the rounds):

* ``host``: a loop of calls with the GPU left to drain only at the end, per call: the
  host's own time (the GPU work of these shapes is shorter);
* ``synchronized``: the same with a synchronize after every call (host, launches and GPU).

Implementations: ``dash`` (``dash_cuda.attention``, its ``auto`` backend and schedule),
FlashAttention-4 with and without ``deterministic=True``, and PyTorch SDPA on cuDNN and on
its flash backend (those present). Then, for ``dash`` alone, where its host time goes: the
host time inside the main steps of its call path (each wrapped in a timer, nested steps
inside their callers) and ``cProfile``'s top functions by own time::

    python benchmarks/host_overhead.py --out benchmarks/results

writes ``host_overhead.json`` and ``host_overhead.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import statistics
import time
from pathlib import Path

from harness import kernel_times, load_fa4, no_cuda, provenance, save_report

#: the host-path issue's two shapes, (B, S, H, d), causal
SHAPES = ((4, 1024, 16, 128), (1, 256, 8, 64))
IMPLS = ("dash", "fa4", "fa4-det", "sdpa-cudnn", "sdpa-flash")


def forward_of(impl: str, fa):
    """``impl``'s forward on ``(B, S, H, d)`` leaves, causal; None where it is absent."""
    import torch

    import dash_cuda

    if impl == "dash":
        return lambda q, k, v: dash_cuda.attention(q, k, v, causal=True)
    if impl.startswith("fa4"):
        if fa is None:
            return None
        det = impl == "fa4-det"

        def fa4(q, k, v):
            out = fa(q, k, v, causal=True, deterministic=det)
            return out[0] if isinstance(out, tuple) else out
        return fa4
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
              "sdpa-flash": SDPBackend.FLASH_ATTENTION}[impl]

    def sdpa(q, k, v):
        with sdpa_kernel(chosen):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return out.transpose(1, 2)
    return sdpa


def calls(shape: tuple[int, int, int, int], fa) -> dict:
    """``{impl: call}``: one forward and its ``autograd.grad``, on fresh inputs per impl."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {}
    for impl in IMPLS:
        fwd = forward_of(impl, fa)
        if fwd is None:
            continue
        q, k, v = (torch.randn(*shape, device="cuda", generator=gen).bfloat16()
                   .requires_grad_() for _ in range(3))
        do = torch.randn(*shape, device="cuda", generator=gen).bfloat16()

        def call(fwd=fwd, q=q, k=k, v=v, do=do):
            torch.autograd.grad(fwd(q, k, v), (q, k, v), do)
        try:
            for _ in range(3):
                call()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run here is left out
            print(f"{impl}: left out ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        out[impl] = call
    return out


def per_call_us(call, n: int, synchronized: bool) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
        if synchronized:
            torch.cuda.synchronize()
    spent = time.perf_counter() - start
    torch.cuda.synchronize()
    return spent * 1e6 / n


def compare(fns: dict, n: int, rounds: int, short: int = 10) -> dict:
    """Median host and synchronized microseconds per call of every implementation of
    ``fns`` (:func:`calls`): ``host`` over loops of ``n`` calls, ``host_short`` over loops
    of ``short`` (where the GPU's work per call is near the host's, a long loop can end up
    waiting for the GPU: the short one is then faster)."""
    keys = list(fns)
    loops = {"host": (n, False), "host_short": (short, False), "synchronized": (n, True)}
    times = {k: {mode: [] for mode in loops} for k in keys}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            for mode, (calls_, synchronized) in loops.items():
                times[key][mode].append(per_call_us(fns[key], calls_, synchronized))
    return {"times_us": times,
            "median_us": {k: {m: round(statistics.median(v), 1) for m, v in t.items()}
                          for k, t in times.items()},
            "least_us": {k: {m: round(min(v), 1) for m, v in t.items()}
                         for k, t in times.items()}}


#: (module, function or Class.method): the steps of the call path whose host time the
#: breakdown reports (where a step is looked up when called: ``ops`` calls the launch's
#: functions by the names it imported). A call like an earlier one (``calls.key``) takes
#: its checked options and plans (``ForwardPlan.run``, ``BackwardPlan.run``); the first
#: call of one, the checks and the general path.
STEPS = [("dash_cuda.calls", "key"), ("dash_cuda.api", "_checked"),
         ("dash_cuda.ops", "forward_views"),
         ("dash_cuda.ops", "backward_views"), ("dash_cuda.plans", "signature"),
         ("dash_cuda.plans", "ForwardPlan.run"), ("dash_cuda.plans", "BackwardPlan.run"),
         ("dash_cuda.ops", "run_forward"), ("dash_cuda.ops", "run_backward"),
         ("dash_cuda.launch", "device_schedule"),
         ("dash_cuda.prepost", "preprocess_delta"),
         ("dash_cuda.backends.cute.launch", "run_schedule"),
         ("dash_cuda.backends.cute.launch", "pad_row_stats"),
         ("dash_cuda.backends.cute.finish_dq", "finish_dq_tiles")]


def step_owner(module_name: str, path: str) -> tuple[object, str]:
    """``(owner, name)`` of a step of :data:`STEPS`: the module, or the class of a
    ``Class.method`` path, and the attribute's name."""
    owner = importlib.import_module(module_name)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name


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
    for module_name, path in STEPS:
        owner, name = step_owner(module_name, path)
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, timer(path, getattr(owner, name)))
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


def profile_top(call, calls: int) -> str:
    import torch

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(20)
    return text.getvalue()


def markdown(r: dict) -> str:
    lines = ["# Host time of one forward + backward call, beside the peers", "",
             f"`{r['command']}` at `{r['git_revision']}`, {r['gpu']}, bf16, causal. One call: "
             "the forward on leaves that require gradients, then `torch.autograd.grad` of "
             "its output; every implementation timed the same way in one process, "
             f"{r['calls']} calls per round, {r['rounds']} interleaved rounds: the median "
             "over rounds, and the least (a host shared with other work only adds time to a "
             "round, so the least is the closest to the call's own cost). `host`: the loop "
             "with the GPU drained only at its end (the host's own time per call, unless the "
             "launch queue fills and the loop waits for the GPU); `host, "
             f"{r.get('short_calls', 10)} calls`: the same over loops of "
             f"{r.get('short_calls', 10)} calls, too few to fill the queue (where it is "
             "below `host`, the longer loop waited for the GPU); `synchronized`: a "
             "synchronize after "
             "every call; `GPU kernels`: the kernels' own time per call (`torch.profiler`, 20 "
             "calls; where it exceeds the host's time, the host loop measures it instead). "
             "`peer / dash`: the peer's host time over ours (above 1: ours costs the host "
             "less).", ""]
    for cell in r["shapes"]:
        b, s, h, d = cell["shape_bshd"]
        med, least = cell["median_us"], cell.get("least_us", cell["median_us"])
        lines += [f"## (B, S, H, d) = ({b}, {s}, {h}, {d})", "",
                  "| implementation | host us (median) | host us (least) | host us, "
                  f"{r.get('short_calls', 10)} calls (median / least) | synchronized us "
                  "(median) | GPU kernels us | peer / dash (host, median) "
                  "| peer / dash (host, least) |", "|---|---|---|---|---|---|---|---|"]
        gpu = cell.get("kernel_us", {})
        for impl, t in med.items():
            ratios = [f"{x[impl]['host'] / x['dash']['host']:.2f}"
                      if "dash" in x and impl != "dash" else "-" for x in (med, least)]
            short = (f"{t['host_short']:.0f} / {least[impl]['host_short']:.0f}"
                     if "host_short" in t else "-")
            lines.append(f"| {impl} | {t['host']:.0f} | {least[impl]['host']:.0f} | {short} | "
                         f"{t['synchronized']:.0f} | {gpu.get(impl, float('nan')):.0f} | "
                         f"{ratios[0]} | {ratios[1]} |")
        lines += ["", "Host time inside the steps of `dash` (each includes the steps it "
                  "calls):", "", "| step | us per call |", "|---|---|",
                  *[f"| `{n}` | {us:.0f} |" for n, us in cell.get("steps_us", {}).items()], ""]
    lines += ["`cProfile`, `dash` at the first shape, by own time:", "", "```",
              r["cprofile_top"].strip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--short-calls", type=int, default=10,
                    help="calls per loop of the short host loop (default 10)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if no_cuda("host_overhead"):
        return 2
    import torch

    fa = load_fa4()
    report = {**provenance("host_overhead.py", argv), "gpu": torch.cuda.get_device_name(0),
              "calls": args.calls, "short_calls": args.short_calls, "rounds": args.rounds,
              "shapes": []}
    for shape in SHAPES:
        fns = calls(shape, fa)
        cell = compare(fns, args.calls, args.rounds, args.short_calls)
        dash_call = fns.get("dash")
        cell["shape_bshd"] = list(shape)
        # what the GPU does for one call, which the host loop would measure instead of the
        # host's own time wherever it took longer
        by_name = {impl: kernel_times(fn, 20) for impl, fn in fns.items()}
        cell["kernels_by_name_us"] = {impl: {n: round(t, 1) for n, t in k.items()}
                                      for impl, k in by_name.items()}
        cell["kernel_us"] = {impl: round(sum(k.values()), 1) for impl, k in by_name.items()}
        if dash_call is not None:
            cell["steps_us"] = breakdown(dash_call, args.calls)
            if "cprofile_top" not in report:
                report["cprofile_top"] = profile_top(dash_call, args.calls)
        print(shape, cell["median_us"], flush=True)
        report["shapes"].append(cell)
    report.setdefault("cprofile_top", "")
    save_report(args.out, "host_overhead", report, markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
