"""What every benchmark shares: the grid, the timing, the peers, the kernel internals they read,
the environment record and the report files (docs/design.md section 8).

* **grid**: 16384 tokens, hidden 2048 (``d = 64, H = 32`` and ``d = 128, H = 16``), ``S``
  from 512 to 16384 in powers of two, ``B = 16384 / S``, bf16, full and causal masks;
* **timing**: CUDA events around each call after warm-up, the median of at least 10; a CUDA
  graph replay where the call can be captured, plain calls otherwise; interleaved rounds
  (every implementation once per round, in an order that rotates) where two kernels are
  compared;
* **peers**: no-argument forward and backward closures of ``dash_cuda`` (a backend and a
  schedule), PyTorch SDPA (cuDNN, flash, memory-efficient) and FlashAttention-4 with and
  without ``deterministic=True`` (found by :func:`verify.impls.load_fa4`);
* **kernel internals**: the configurations, tile rules and kernel variants of the backends
  (``dash_cuda.backends.cute``, ``dash_cuda.backends.triton``) that some benchmarks read,
  each imported in one function here;
* **reports**: ``STEM.json`` (the data) and ``STEM.md`` (the table) with the command, git
  revision, GPU and versions; the ranges of an Nsight Compute profile folder.

Every ``torch`` and ``dash_cuda`` import is inside a function: the CPU-only tools
(``model_*``, ``ncu_summary``, ``ncu_hotspots``) import this module without them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from dash_cuda.backends.triton.config import HEAD_DIMS as TRITON_HEAD_DIMS

# -- the grid ----------------------------------------------------------------------------------
TOKENS, HIDDEN = 16384, 2048
HEAD_DIMS = (64, 128)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
MASKS = ("full", "causal")


def grid_cells(head_dims=HEAD_DIMS, masks=MASKS, seqlens=SEQLENS
               ) -> Iterator[tuple[int, int, int, int, bool]]:
    """``(d, H, S, B, causal)`` of every cell, head dim first, then mask, then length."""
    for d in head_dims:
        for causal in (m == "causal" for m in masks):
            for s in seqlens:
                yield d, HIDDEN // d, s, TOKENS // s, causal


def group_error(group: int, head_dims) -> str | None:
    """Why the grid cannot run ``group`` query heads per KV head at ``head_dims`` (the grid's
    head counts are ``HIDDEN / d``), or None."""
    if group < 1 or any((HIDDEN // d) % group for d in head_dims):
        return f"the group must divide the head count {HIDDEN} / d for d in {list(head_dims)}"
    return None


def grid_inputs(d: int, s: int, gen, group: int = 1):
    """``(q, k, v, dO)`` of the grid cell ``(d, S)``: bf16 ``(B, S, H, d)``, 16384 tokens,
    hidden 2048; K and V with ``H / group`` heads (grouped-query attention)."""
    import torch

    h, b = HIDDEN // d, TOKENS // s
    return tuple(torch.randn(b, s, heads, d, device="cuda", generator=gen).bfloat16()
                 for heads in (h, h // group, h // group, h))


def flops_backward(b: int, h: int, s: int, d: int, causal: bool) -> float:
    """FlashAttention's count: 2.5 x ``4 B H S^2 d``, halved for a causal square."""
    from dash_ref import Problem

    return Problem(b, h, h, s, s, d, "causal" if causal else "full").flops_backward()


def parse_cell(text: str) -> tuple[int, str, int]:
    """``D:MASK:S`` as ``(d, mask, S)`` (an ``argparse`` type)."""
    try:
        d, mask, s = text.split(":")
        cell = int(d), mask, int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected D:MASK:S, got {text!r}") from None
    if mask not in MASKS:
        raise argparse.ArgumentTypeError(f"mask must be full or causal, got {mask!r}")
    return cell


# -- timing ------------------------------------------------------------------------------------
def replayable(fn: Callable, warmup: int) -> tuple[Callable, str]:
    """``(run, mode)``: ``fn`` captured in a CUDA graph after ``warmup`` calls (``run`` replays
    it, mode ``"graph"``), or ``fn`` itself where capture fails (mode ``"eager"``)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run, mode = fn, "eager"
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm the side stream's allocator pool
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph.replay()
        torch.cuda.synchronize()
        run, mode = graph.replay, "graph"
    except Exception as err:  # noqa: BLE001 - any capture failure means "time it eagerly"
        print(f"    (graph capture failed: {type(err).__name__}: {err}; timing eagerly)")
        torch.cuda.synchronize()
    return run, mode


def median_ms(run: Callable, reps: int) -> float:
    """Median milliseconds of ``run`` over ``reps`` calls, CUDA events around each, after two
    untimed calls."""
    import torch

    for _ in range(2):
        run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def single_call_ms(run: Callable, reps: int) -> float:
    """Median milliseconds of ``run`` as one call from an idle GPU sees it, host included:
    a synchronize, the call, a synchronize, by the host's clock, over ``reps`` calls after
    two untimed ones."""
    import torch

    for _ in range(2):
        run()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timed(fn: Callable, warmup: int, reps: int) -> tuple[float, str]:
    """Median milliseconds of ``fn`` on the GPU: a CUDA graph replay if it can be captured."""
    run, mode = replayable(fn, warmup)
    return median_ms(run, reps), mode


def rotating_rounds(measures: dict, rounds: int) -> dict[object, list[float]]:
    """Each of ``measures`` (a key to a call that returns one measurement) taken once in
    every one of ``rounds`` rounds, in an order that rotates by one from round to round, so
    that a drift of the clock or the temperature hits every key alike."""
    keys = list(measures)
    out: dict[object, list[float]] = {key: [] for key in keys}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            out[key].append(measures[key]())
    return out


def interleaved_rounds(runs: dict[str, Callable], rounds: int, reps: int
                       ) -> dict[str, list[float]]:
    """Each run's :func:`median_ms` in every one of ``rounds`` rounds
    (:func:`rotating_rounds`)."""
    return rotating_rounds({key: partial(median_ms, run, reps) for key, run in runs.items()},
                           rounds)


def kernel_times(fn: Callable, reps: int) -> dict[str, float]:
    """Mean GPU microseconds per call of every kernel (and memset/copy) ``fn`` launches, from
    ``torch.profiler``, the longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            total[evt.name[:90]] += evt.device_time / reps
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


# -- the peers ---------------------------------------------------------------------------------
SDPA_BACKENDS = ("cudnn", "flash", "efficient")


def load_fa4():
    """FlashAttention-4's ``flash_attn_func``, or None where it is not importable."""
    from verify.impls import load_fa4 as load

    return load()


def sdpa_closures(backend: str, q, k, v, do, causal: bool):
    """``(fwd, bwd)`` of PyTorch SDPA on one backend of :data:`SDPA_BACKENDS` (its forward run
    once here, the graph kept for the backward)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))

    def fwd():
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                    is_causal=causal)

    out = fwd()
    dot = do.transpose(1, 2)
    return fwd, lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)


def grad_row(fwd, inputs: tuple, do) -> tuple:
    """``(fwd, bwd)`` of one row: ``bwd`` is ``torch.autograd.grad`` of one forward's output
    (its graph kept), as a training step reaches every implementation's backward."""
    import torch

    out = fwd()
    return fwd, lambda: torch.autograd.grad(out, inputs, do, retain_graph=True)


def grad_step(fwd, inputs: tuple, do) -> Callable:
    """One training step's attention: ``fwd``, then ``torch.autograd.grad`` of its output
    (the graph freed), as a step runs forward and backward back to back."""
    import torch

    def step():
        return torch.autograd.grad(fwd(), inputs, do)

    return step


def fa4_closures(fa, deterministic: bool, q, k, v, do, causal: bool):
    """``(fwd, bwd)`` of FlashAttention-4's ``fa`` (:func:`load_fa4`), with or without
    ``deterministic=True``, through autograd (:func:`grad_row`)."""
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

    def fwd():
        out = fa(qg, kg, vg, causal=causal, deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out

    return grad_row(fwd, (qg, kg, vg), do)


def dash_autograd_closures(backend: str, name: str, q, k, v, do, causal: bool,
                           workers: int | None):
    """``(fwd, bwd)`` of ``dash_cuda.attention`` through autograd (:func:`grad_row`), as
    :func:`fa4_closures` reaches FlashAttention-4: schedule ``name`` on ``backend``."""
    import dash_cuda

    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    return grad_row(lambda: dash_cuda.attention(qg, kg, vg, causal=causal, schedule=name,
                                                num_workers=workers, backend=backend),
                    (qg, kg, vg), do)


def dash_closures(backend: str, name: str, q, k, v, do, causal: bool, workers: int | None):
    """``(fwd, bwd)`` of ``dash_cuda`` on ``backend``: schedule ``name``, or its atomic peer
    for ``name == "atomic"`` (O and LSE computed once here for the backward)."""
    import dash_cuda

    det = name != "atomic"
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    return (lambda: dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend),
            lambda: dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                                 schedule=name if det else "auto",
                                                 deterministic=det, num_workers=workers,
                                                 backend=backend))


def peer_closures(impl: str, q, k, v, do, causal: bool, workers: int | None = None, fa=None):
    """``(fwd, bwd)`` of a row name: ``BACKEND:SCHEDULE`` (``dash_cuda``), ``sdpa-BACKEND``,
    ``fa4`` or ``fa4-det`` (``fa``: FlashAttention-4, looked up here if not given)."""
    if ":" in impl:
        backend, name = impl.split(":")
        return dash_closures(backend, name, q, k, v, do, causal, workers)
    if impl.startswith("sdpa-"):
        return sdpa_closures(impl[5:], q, k, v, do, causal)
    if impl not in ("fa4", "fa4-det"):
        raise ValueError(f"unknown implementation {impl!r}")
    fa = fa if fa is not None else load_fa4()
    if fa is None:
        raise RuntimeError("FlashAttention-4 is not importable")
    return fa4_closures(fa, impl == "fa4-det", q, k, v, do, causal)


# -- kernel internals: every import of a name inside a backend's kernel modules is here ----------
def cute_backward_tiles(head_dim: int, mask: str = "full"):
    """The CuTe backward's configuration for a head dim and mask kind (``block_m``,
    ``block_n``, ``dq_stages``, ...)."""
    from dash_cuda.backends.cute.config import backward_config

    return backward_config(head_dim, mask)


def cute_forward_block_m(head_dim: int, causal: bool, seqlen_q: int) -> int:
    """The query rows per tile the CuTe forward picks for a problem."""
    from dash_cuda.backends.cute.config import forward_config

    return forward_config(head_dim, "causal" if causal else "full", seqlen_q).block_m


def cute_forward_block_ms(head_dim: int) -> tuple[int, ...]:
    """Every tile height the CuTe forward has at ``head_dim`` (for either mask)."""
    from dash_cuda.backends.cute.config import forward_configs

    return tuple(sorted({c.block_m for mask in MASKS for c in forward_configs(head_dim, mask)}))


def cute_backward_variant(dtype, head_dim: int, mask: str, deterministic: bool,
                          audit: bool = False, per_head: bool = False, softcap: bool = False):
    """The CuTe backward kernel variant of these specializations, with the configuration the
    backend picks (its ``.name`` names the compiled kernel; ``launch.get_kernel`` compiles
    or loads it)."""
    from dash_cuda.backends.cute.variants import backward_variant

    return backward_variant(dtype, head_dim, mask, deterministic, audit, per_head,
                            softcap=softcap)


def cute_probe_slots() -> tuple[int, int]:
    """``(per visit, per chain)``: the ``%clock`` stamps the CuTe backward's probe variant
    writes."""
    from dash_cuda.backends.cute.bwd_kernel import PROBE_CHAIN_SLOTS, PROBE_VISIT_SLOTS

    return PROBE_VISIT_SLOTS, PROBE_CHAIN_SLOTS


def triton_backward_tiles(head_dim: int):
    """The Triton backward's tile configuration at ``head_dim`` (``block_m``, ``block_n``,
    ``num_warps``, ``num_stages``, ...)."""
    from dash_cuda.backends.triton.config import backward_config

    return backward_config(head_dim)


# -- the environment ---------------------------------------------------------------------------
def git_revision(full: bool = False) -> str:
    """The revision the results come from: ``$DASH_GIT_REV`` (the GPU machine's copy has no
    git history, so the caller passes it in), else git's (short unless ``full``), else
    ``"unknown"``."""
    rev = os.environ.get("DASH_GIT_REV")
    if rev:
        return rev
    try:
        return subprocess.run(["git", "rev-parse", *([] if full else ["--short"]), "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(script: str, argv: list[str] | None) -> dict[str, str]:
    """``command`` (how to run ``benchmarks/SCRIPT`` again, with the arguments it was given:
    ``argv``, or the process's own) and ``git_revision`` of a report."""
    args = argv if argv is not None else sys.argv[1:]
    return {"command": " ".join(["python", f"benchmarks/{script}", *args]),
            "git_revision": git_revision()}


def environment(args) -> dict:
    """The GPU run's record: command, full git revision, date, GPU and SM count, versions,
    workers, the Triton backward's tiles at ``args.head_dims`` and the timing settings
    (``args.workers``, ``args.warmup``, ``args.reps``; head dims and workers default to the
    grid's and the SM count)."""
    import torch
    import triton

    props = torch.cuda.get_device_properties(0)
    workers = getattr(args, "workers", None)
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_revision": git_revision(full=True),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name, "sm_count": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "num_workers": workers or props.multi_processor_count,
        "tiles": {d: list(vars(triton_backward_tiles(d)).values())  # the Triton backward's
                  for d in getattr(args, "head_dims", HEAD_DIMS) if d in TRITON_HEAD_DIMS},
        "tiles_fields": ["block_m", "block_n", "num_warps", "num_stages"],
        "warmup": args.warmup, "reps": args.reps,
    }


def no_cuda(tool: str) -> bool:
    """True, after a one-line message on stderr, where this process sees no CUDA device: a
    GPU benchmark's ``main`` then exits 2."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"{tool}: needs a CUDA device", file=sys.stderr)
    return True


# -- the DAG model's calibration (CPU-only tools) --------------------------------------------------
CALIBRATION = Path("benchmarks/results/model_vs_measured.json")


def model_calibration(path: Path, head_dim: int) -> tuple[float, float]:
    """``(r / c, l / c)`` at ``head_dim`` from the committed model-vs-measured fit: its
    ``rho`` and the median hand-off latency over S = 1k - 4k."""
    fit = json.loads(path.read_text())
    lat = [x["latency_over_c"] for x in fit["latency"]
           if x["d"] == head_dim and 1024 <= x["S"] <= 4096]
    return fit["rho"][str(head_dim)], statistics.median(lat)


def model_main(tool: str, description: str, head_dim: int, run: Callable,
               markdown: Callable, argv: list[str] | None) -> int:
    """The ``main`` of a model tool that runs ``run(r / c, l / c, workers)`` at one head dim
    and writes ``OUT/TOOL.json`` and ``OUT/TOOL.md`` (exit 2 without the calibration)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--calibration", type=Path, default=CALIBRATION)
    ap.add_argument("--workers", type=int, default=132)
    args = ap.parse_args(argv)
    if not args.calibration.exists():
        print(f"{tool}: no calibration at {args.calibration}", file=sys.stderr)
        return 2
    rho, latency = model_calibration(args.calibration, head_dim)
    report = {"workers": args.workers, "calibration": str(args.calibration),
              "r_over_c": rho, "l_over_c": latency,
              "rows": run(rho, latency, args.workers)}
    save_report(args.out, tool, report, markdown(report))
    return 0


# -- reports -----------------------------------------------------------------------------------
def save_report(out: Path, stem: str, report: dict, table: str) -> None:
    """``OUT/STEM.json`` (every measurement) and ``OUT/STEM.md`` (the table); prints the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{stem}.md").write_text(table)
    print(table)


def ranges_of(folder: Path, kernels: list, source: str, name=lambda k: k["Kernel Name"]
              ) -> list[tuple[dict, list]]:
    """``(range, its kernels)`` for every range of an Nsight Compute profile folder's
    ``ranges.json`` (``ncu_workload.py``) that ran a kernel: the kernels after each
    ``spin_kernel`` marker up to the next (``name`` gives a kernel's name; ``source`` names
    the export in the error when the counts differ)."""
    ranges = json.loads((folder / "ranges.json").read_text())
    groups: list[list] = []
    for k in kernels:
        if "spin_kernel" in name(k):
            groups.append([])
        elif groups:
            groups[-1].append(k)
    if len(groups) != len(ranges):
        raise ValueError(f"{len(groups)} marked ranges in {source}, {len(ranges)} in "
                         "ranges.json")
    return [(meta, group) for meta, group in zip(ranges, groups) if group]


def profile_main(argv: list[str] | None, tool: str, description: str, export: str,
                 build, table) -> int:
    """The command line of a report over a profile folder (``export`` and ``ranges.json``
    in it): ``build(folder)`` makes the report, ``table(report)`` its Markdown."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="default: the folder")
    parser.add_argument("--tag", default=tool)
    parser.add_argument("--command", default=None, help="how the profile was taken")
    parser.add_argument("--revision", default=None, help="the git revision profiled")
    args = parser.parse_args(argv)
    for name in (export, "ranges.json"):
        if not (args.folder / name).is_file():
            print(f"{tool}: {args.folder / name} not found", file=sys.stderr)
            return 2
    try:
        report = build(args.folder)
    except ValueError as err:
        print(f"{tool}: {err}", file=sys.stderr)
        return 2
    if args.command:
        report.update(command=args.command, git_revision=args.revision or "unknown")
    save_report(args.out or args.folder, args.tag, report, table(report))
    return 0
