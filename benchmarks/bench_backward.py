"""Backward TFLOP/s of every dash_cuda schedule, its atomic peer and cuDNN (design section 8).

The grid is the paper's: 16384 tokens, hidden 2048 (``d = 64, H = 32`` and ``d = 128,
H = 16``), ``S`` from 512 to 16384 in powers of two with ``B = 16384 / S``, bf16, full and
causal masks. Every peer runs in this one process on the same inputs. Each backward is
captured in a CUDA graph (falling back to plain calls where capture fails) so that the
numbers are the GPU's, not the Python launcher's; times come from CUDA events around each
replay after warm-up, median of ``--reps``. FLOPs follow FlashAttention: backward = 2.5 x
``4 B H S^2 d``, halved for causal.

Writes ``bench_backward.json`` (every measurement and the environment) and
``bench_backward.md`` (the table) under ``--out``::

    PYTHONPATH=. python benchmarks/bench_backward.py --out benchmarks/results/<name>
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from report import git_revision, save_report

import dash_cuda
from dash_cuda import backward_problem, tables
from dash_cuda.backends.triton.config import backward_config
from dash_ref import DETERMINISTIC, Problem

TOKENS, HIDDEN = 16384, 2048
PEERS_DASH = (*DETERMINISTIC, "atomic")


def flops_backward(b: int, h: int, s: int, d: int, causal: bool) -> float:
    return Problem(b, h, h, s, s, d, "causal" if causal else "full").flops_backward()


def replayable(fn, warmup: int) -> tuple:
    """``(run, mode)``: ``fn`` captured in a CUDA graph after ``warmup`` calls (``run`` replays
    it, mode ``"graph"``), or ``fn`` itself where capture fails (mode ``"eager"``)."""
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


def median_ms(run, reps: int) -> float:
    """Median milliseconds of ``run`` over ``reps`` calls, CUDA events around each, after two
    untimed calls."""
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


def timed(fn, warmup: int, reps: int) -> tuple[float, str]:
    """Median milliseconds of ``fn`` on the GPU: a CUDA graph replay if it can be captured."""
    run, mode = replayable(fn, warmup)
    return median_ms(run, reps), mode


def cudnn_backward(q, k, v, do, causal):
    """A closure running cuDNN's SDPA backward (its forward done once, graph retained)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = do.transpose(1, 2)
    return lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)


def environment(args) -> dict:
    props = torch.cuda.get_device_properties(0)
    import triton

    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_revision": git_revision(full=True),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": props.name, "sm_count": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "num_workers": args.workers or props.multi_processor_count,
        "tiles": {d: list(vars(backward_config(d)).values()) for d in args.head_dims},
        "tiles_fields": ["block_m", "block_n", "num_warps", "num_stages"],
        "warmup": args.warmup, "reps": args.reps,
    }


def cells(args):
    for d in args.head_dims:
        for causal in (m == "causal" for m in args.masks):
            for s in args.seqlens:
                yield d, HIDDEN // d, s, TOKENS // s, causal


def run(args) -> dict:
    env = environment(args)
    workers = env["num_workers"]
    t0 = time.perf_counter()
    keys = [(backward_problem(b, h, h, s, s, d, causal), name, workers)
            for d, h, s, b, causal in cells(args) for name in args.schedules]
    tables.prepare(keys, processes=args.processes)
    print(f"built and validated {len(keys)} schedules in {time.perf_counter() - t0:.1f} s",
          flush=True)
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d, h, s, b, causal in cells(args):
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16()
                       for _ in range(4))
        o, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
        flops = flops_backward(b, h, s, d, causal)
        peers = {name: functools.partial(
            dash_cuda.attention_backward, q, k, v, o, lse, do, causal=causal, schedule=name,
            deterministic=name != "atomic", num_workers=args.workers)
            for name in args.schedules}
        if not args.no_cudnn:
            peers["cudnn"] = functools.partial(cudnn_backward, q, k, v, do, causal)
        for peer, fn in peers.items():
            try:
                if peer == "cudnn":
                    fn = fn()
                ms, mode = timed(fn, args.warmup, args.reps)
            except Exception as err:  # noqa: BLE001 - record the failure, keep measuring
                print(f"d={d} S={s} {peer}: FAILED {type(err).__name__}: {err}", flush=True)
                records.append(dict(d=d, H=h, S=s, B=b, mask="causal" if causal else "full",
                                    peer=peer, error=f"{type(err).__name__}: {err}"))
                continue
            rec = dict(d=d, H=h, S=s, B=b, mask="causal" if causal else "full", peer=peer,
                       ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1), timing=mode)
            records.append(rec)
            print(f"d={d:<3} {rec['mask']:<6} S={s:<5} B={b:<2} {peer:<16} {ms:8.3f} ms "
                  f"{rec['tflops']:6.1f} TFLOP/s ({mode})", flush=True)
        peers.clear()
        torch.cuda.empty_cache()
    return {"environment": env, "results": records}


def markdown(report: dict, schedules) -> str:
    env, rows = report["environment"], report["results"]
    det = [s for s in schedules if s in DETERMINISTIC]
    peers = [*schedules, "cudnn"]
    lines = [
        "# Backward TFLOP/s: dash_cuda schedules, atomic peer, cuDNN",
        "",
        f"`{env['command']}`",
        "",
        f"{env['gpu']} ({env['sm_count']} SMs), torch {env['torch']}, triton {env['triton']}, "
        f"CUDA {env['cuda']}, cuDNN {env['cudnn']}; git {env['git_revision']}; "
        f"{env['date_utc']}; num_workers {env['num_workers']}; backward tiles "
        f"(BM, BN, warps, stages) {env['tiles']}; median of {env['reps']} after "
        f"{env['warmup']} warm-up runs, CUDA events around CUDA-graph replays.",
        "",
        "| d | mask | S | B | " + " | ".join(peers) + " | best det | best/atomic | "
        "best/cuDNN |",
        "|" + "---|" * (4 + len(peers) + 3),
    ]
    by_cell: dict = {}
    for r in rows:
        if "tflops" not in r:
            continue
        by_cell.setdefault((r["d"], r["mask"], r["S"], r["B"]), {})[r["peer"]] = r["tflops"]
    for (d, mask, s, b), t in by_cell.items():
        best = max(det, key=lambda n: t.get(n, 0.0)) if det else None
        cells_ = [f"{t[p]:.1f}" if p in t else "-" for p in peers]
        ratio_a = f"{t[best] / t['atomic']:.3f}" if best and "atomic" in t else "-"
        ratio_c = f"{t[best] / t['cudnn']:.3f}" if best and "cudnn" in t else "-"
        lines.append(f"| {d} | {mask} | {s} | {b} | " + " | ".join(cells_)
                     + f" | {best} | {ratio_a} | {ratio_c} |")
    if "naive" in det:
        lines += ["", "Paper's orderings (ratio of TFLOP/s):", ""]
        for (d, mask, s, _), t in by_cell.items():
            other = "shift" if mask == "full" else "descending"
            if other in t:
                lines.append(f"- d={d} {mask} S={s}: {other} / naive = "
                             f"{t[other] / t['naive']:.3f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int,
                        default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--masks", nargs="+", default=["full", "causal"],
                        choices=["full", "causal"])
    parser.add_argument("--schedules", nargs="+", default=list(PEERS_DASH),
                        choices=list(PEERS_DASH))
    parser.add_argument("--workers", type=int, default=None, help="default: SM count")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--processes", type=int, default=os.cpu_count(),
                        help="processes that build and validate the schedules")
    parser.add_argument("--no-cudnn", action="store_true")
    parser.add_argument("--tag", default="bench_backward", help="output file stem")
    args = parser.parse_args(argv)
    if args.reps < 10:
        parser.error("--reps must be at least 10")
    report = run(args)
    save_report(args.out, args.tag, report, markdown(report, args.schedules))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
