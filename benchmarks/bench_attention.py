"""Forward and backward TFLOP/s on the paper's grid for every dash_cuda schedule and every peer.

One process on one GPU, the same inputs for everyone: each dash_cuda schedule and its
``atomic`` peer on every backend of ``--backends`` (rows ``BACKEND:SCHEDULE``), PyTorch
SDPA (cuDNN and flash backends) and FlashAttention-4's Hopper
kernels with and without ``deterministic=True`` when importable (``/tmp/site`` from
``scripts/fa4_bundle.sh``). Every cell also records whether 20 repeated backwards were
bitwise equal. Times are CUDA events around CUDA-graph replays after warm-up (eager where
capture fails), median of ``--reps``; FLOPs follow FlashAttention (backward = 2.5 x
forward, causal halved). Writes ``<tag>.json``, ``<tag>.md`` and ``<tag>.png`` to ``--out``::

    PYTHONPATH=. python benchmarks/bench_attention.py --out benchmarks/results
    python benchmarks/bench_attention.py --plot benchmarks/results/bench_attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from harness import (
    HIDDEN,
    SEQLENS,
    environment,
    flops_backward,
    grid_cells,
    grid_inputs,
    load_fa4,
    peer_closures,
    save_report,
    timed,
)

REPEATS = 20


def ours(impl: str) -> bool:
    """A ``BACKEND:SCHEDULE`` row of dash_cuda (the peers have no colon)."""
    return ":" in impl


def deterministic(impl: str) -> bool:
    return ours(impl) and not impl.endswith(":atomic")


def repeatable(bwd, n: int = REPEATS) -> bool:
    """True if ``n`` backwards give bitwise-equal dQ, dK and dV."""
    import torch

    first = [g.clone() for g in bwd()]
    return all(all(torch.equal(a, b) for a, b in zip(first, bwd())) for _ in range(n - 1))


def run(args) -> dict:
    import torch

    from dash_cuda import backward_problem, tables
    from dash_ref import DETERMINISTIC

    fa = load_fa4()
    env = environment(args)
    env["fa4"] = "available" if fa is not None else "not importable"
    dash_rows = [f"{be}:{n}" for be in args.backends for n in (*DETERMINISTIC, "atomic")]
    peers = ["sdpa-cudnn", "sdpa-flash"] + (["fa4", "fa4-det"] if fa is not None else [])
    cells = list(grid_cells(args.head_dims, args.masks, args.seqlens))
    t0 = time.perf_counter()
    tables.prepare([(backward_problem(b, h, h, s, s, d, causal, backend=be), n,
                     env["num_workers"])
                    for d, h, s, b, causal in cells for n in DETERMINISTIC
                    for be in args.backends],
                   processes=args.processes)
    print(f"schedules built and validated in {time.perf_counter() - t0:.0f} s", flush=True)
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    deadline = time.perf_counter() + args.time_budget
    for n_cell, (d, h, s, b, causal) in enumerate(cells, 1):
        if time.perf_counter() > deadline:
            print(f"time budget of {args.time_budget} s spent: {len(cells) - n_cell + 1} "
                  "cells not measured", flush=True)
            env["cells_skipped"] = len(cells) - n_cell + 1
            break
        q, k, v, do = grid_inputs(d, s, gen)
        flops_b = flops_backward(b, h, s, d, causal)
        mask = "causal" if causal else "full"
        for impl in dash_rows + peers:
            rec = {"d": d, "H": h, "S": s, "B": b, "mask": mask, "impl": impl}
            try:
                fwd, bwd = peer_closures(impl, q, k, v, do, causal, args.workers, fa)
                fwd_ms, _ = timed(fwd, args.warmup, args.reps)
                bwd_ms, mode = timed(bwd, args.warmup, args.reps)
                rec.update(fwd_ms=round(fwd_ms, 4), bwd_ms=round(bwd_ms, 4), timing=mode,
                           fwd_tflops=round(flops_b / 2.5 / fwd_ms / 1e9, 1),
                           bwd_tflops=round(flops_b / bwd_ms / 1e9, 1),
                           bitwise_repeat=repeatable(bwd))
                print(f"[{n_cell}/{len(cells)}] d={d:<3} {mask:<6} S={s:<5} {impl:<22} "
                      f"fwd {rec['fwd_tflops']:6.1f} bwd {rec['bwd_tflops']:6.1f} TFLOP/s "
                      f"repeat={'yes' if rec['bitwise_repeat'] else 'NO'} ({mode})",
                      flush=True)
            except Exception as err:  # noqa: BLE001 - record, keep measuring
                rec["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                print(f"[{n_cell}/{len(cells)}] d={d} {mask} S={s} {impl}: FAILED "
                      f"{rec['error'][:160]}", flush=True)
            records.append(rec)
            torch.cuda.empty_cache()
    return {"environment": env, "results": records}


def best_deterministic(by_impl: dict[str, dict], backend: str | None = None
                       ) -> tuple[str, float]:
    """The fastest deterministic dash_cuda row of a cell (of one backend, if given)."""
    det = {k: r["bwd_tflops"] for k, r in by_impl.items()
           if deterministic(k) and "bwd_tflops" in r
           and (backend is None or k.startswith(f"{backend}:"))}
    name = max(det, key=det.get)
    return name, det[name]


def by_cell(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["d"], r["mask"], r["S"], r["B"]), {})[r["impl"]] = r
    return out


def markdown(report: dict) -> str:
    env, rows = report["environment"], report["results"]
    cells = by_cell(rows)
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    lines = [
        "# Attention TFLOP/s on the paper's grid (bf16, 16384 tokens, hidden 2048)", "",
        f"`{env['command']}`", "",
        f"{env['gpu']} ({env['sm_count']} SMs), torch {env['torch']}, triton {env['triton']}, "
        f"CUDA {env['cuda']}, cuDNN {env['cudnn']}, FlashAttention-4 {env['fa4']}; git "
        f"{env['git_revision']}; {env['date_utc']}; num_workers {env['num_workers']}; "
        f"median of {env['reps']} after {env['warmup']} warm-up runs.", "",
        "## Backward TFLOP/s (`*`: 20 repeated backwards were NOT bitwise equal)", "",
        "| d | mask | S | " + " | ".join(impls) + " |",
        "|" + "---|" * (3 + len(impls)),
    ]
    for (d, mask, s, _), t in cells.items():
        vals = []
        for i in impls:
            r = t.get(i, {})
            vals.append(f"{r['bwd_tflops']:.1f}{'' if r['bitwise_repeat'] else '*'}"
                        if "bwd_tflops" in r else "err")
        lines.append(f"| {d} | {mask} | {s} | " + " | ".join(vals) + " |")
    backends = list(dict.fromkeys(i.split(":")[0] for i in impls if ours(i)))
    for backend in backends:
        lines += ["", f"## The gap: best deterministic `{backend}` schedule over each peer",
                  "", "| d | mask | S | best schedule | TFLOP/s | / FA4 det | / FA4 | / cuDNN "
                  "| / own atomic |", "|---|---|---|---|---|---|---|---|---|"]
        for (d, mask, s, _), t in cells.items():
            try:
                name, best = best_deterministic(t, backend)
            except ValueError:
                continue

            def ratio(key: str, t=t, best=best) -> str:
                r = t.get(key, {})
                return f"{best / r['bwd_tflops']:.2f}" if "bwd_tflops" in r else "-"

            lines.append(f"| {d} | {mask} | {s} | {name.split(':')[1]} | {best:.1f} | "
                         f"{ratio('fa4-det')} | {ratio('fa4')} | {ratio('sdpa-cudnn')} | "
                         f"{ratio(f'{backend}:atomic')} |")
    for backend in backends:
        lines += portable_table(cells, backend)
    lines += forward_table(cells, backends)
    lines += step_table(cells, backends)
    return "\n".join(lines) + "\n"


def best_portable(by_impl: dict[str, dict], backend: str) -> tuple[str, float]:
    """The fastest row of ``backend`` among the schedules whose bits ignore the SM count."""
    from dash_ref import PORTABLE

    return best_deterministic({k: r for k, r in by_impl.items()
                               if k.split(":")[-1] in PORTABLE}, backend)


def portable_table(cells: dict, backend: str) -> list[str]:
    """Best portable schedule beside the best of all (``dash_ref.PORTABLE``)."""
    lines = ["", f"## Portable schedules on `{backend}`: bits independent of the SM count",
             "", "| d | mask | S | best portable | TFLOP/s | best of all | TFLOP/s | portable / "
             "best | portable / FA4 det |", "|---|---|---|---|---|---|---|---|---|"]
    for (d, mask, s, _), t in cells.items():
        try:
            name, tflops = best_portable(t, backend)
            best_name, best = best_deterministic(t, backend)
        except ValueError:
            continue
        fa4 = t.get("fa4-det", {})
        vs_fa4 = f"{tflops / fa4['bwd_tflops']:.2f}" if "bwd_tflops" in fa4 else "-"
        lines.append(f"| {d} | {mask} | {s} | {name.split(':')[1]} | {tflops:.1f} | "
                     f"{best_name.split(':')[1]} | {best:.1f} | {tflops / best:.2f} | "
                     f"{vs_fa4} |")
    return lines


def _fwd(t: dict, key: str) -> str:
    r = t.get(key, {})
    return f"{r['fwd_tflops']:.1f}" if "fwd_tflops" in r else "-"


def forward_table(cells: dict, backends: list[str]) -> list[str]:
    """Forward TFLOP/s of each backend (its ``naive`` row: the forward ignores the
    schedule) beside the peers."""
    head = [*backends, "cuDNN", "flash", "FA4"]
    lines = ["", "## Forward TFLOP/s", "", "| d | mask | S | " + " | ".join(head)
             + " | cute / FA4 | cute / cuDNN |", "|---|---|---|" + "---|" * (len(head) + 2)]
    for (d, mask, s, _), t in cells.items():
        keys = [f"{b}:naive" for b in backends] + ["sdpa-cudnn", "sdpa-flash", "fa4"]
        cute = t.get("cute:naive", {}).get("fwd_tflops")

        def vs(key: str, t=t, cute=cute) -> str:
            r = t.get(key, {})
            return f"{cute / r['fwd_tflops']:.2f}" if cute and "fwd_tflops" in r else "-"

        lines.append(f"| {d} | {mask} | {s} | " + " | ".join(_fwd(t, k) for k in keys)
                     + f" | {vs('fa4')} | {vs('sdpa-cudnn')} |")
    return lines


def step_tflops(r: dict, d: int, mask: str, s: int, b: int) -> float | None:
    """Forward + backward TFLOP/s of one row: a training step's attention."""
    from dash_ref import Problem

    if "fwd_ms" not in r or "bwd_ms" not in r:
        return None
    flops = Problem(b, HIDDEN // d, HIDDEN // d, s, s, d, mask).flops_backward() * 1.4
    return flops / (r["fwd_ms"] + r["bwd_ms"]) / 1e9


def step_table(cells: dict, backends: list[str]) -> list[str]:
    """A training step's attention (forward + backward) with the fastest deterministic
    schedule of each backend, its fastest portable one, and the peers."""
    peers = ["fa4-det", "fa4", "sdpa-cudnn", "sdpa-flash"]
    head = [f"{b} {kind}" for b in backends for kind in ("best det", "portable")] + peers
    lines = ["", "## Training step (forward + backward) TFLOP/s", "",
             "Each backend with its fastest deterministic schedule (by backward time) and its "
             "fastest portable one; FLOPs 3.5 x forward.", "",
             "| d | mask | S | " + " | ".join(head) + " | cute det / FA4 det | cute det / FA4 "
             "| cute det / cuDNN |", "|---|---|---|" + "---|" * (len(head) + 3)]
    for (d, mask, s, b), t in cells.items():
        vals: dict[str, float | None] = {}
        for backend in backends:
            for kind, pick in (("best det", best_deterministic), ("portable", best_portable)):
                try:
                    name, _ = pick(t, backend)
                    vals[f"{backend} {kind}"] = step_tflops(t[name], d, mask, s, b)
                except ValueError:
                    vals[f"{backend} {kind}"] = None
        for p in peers:
            vals[p] = step_tflops(t.get(p, {}), d, mask, s, b)
        ours_ = vals.get("cute best det")

        def vs(key: str, vals=vals, ours_=ours_) -> str:
            return f"{ours_ / vals[key]:.2f}" if ours_ and vals.get(key) else "-"

        lines.append(f"| {d} | {mask} | {s} | " + " | ".join(
            f"{vals[h]:.1f}" if vals[h] else "-" for h in head)
            + f" | {vs('fa4-det')} | {vs('fa4')} | {vs('sdpa-cudnn')} |")
    return lines


def plot(report: dict, path: Path) -> None:
    """Backward TFLOP/s against sequence length, one panel per head dim and mask."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if "bwd_tflops" in r]
    panels = sorted({(r["d"], r["mask"]) for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    # colour = schedule (or peer), line = backend: solid CuTe, dash-dot Triton, dotted peers
    names = list(dict.fromkeys(i.split(":")[-1] for i in impls))
    colours = {n: plt.get_cmap("tab10")(k % 10) for k, n in enumerate(names)}
    lines = {"cute": "-", "triton": "-."}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), sharey=True,
                             squeeze=False)
    for ax, (d, mask) in zip(axes[0], panels):
        for impl in impls:
            pts = sorted((r["S"], r["bwd_tflops"]) for r in rows
                         if (r["d"], r["mask"], r["impl"]) == (d, mask, impl))
            if not pts:
                continue
            backend, _, name = impl.rpartition(":")
            ax.plot(*zip(*pts), lines.get(backend, ":"), color=colours[name],
                    marker="o" if backend == "cute" else ("s" if backend else "^"), ms=3,
                    lw=2 if backend == "cute" else 1, label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d = {d}, {mask}")
        ax.set_xlabel("sequence length (batch = 16384 / S)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("backward TFLOP/s")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Backward on {report['environment']['gpu']} (colour: schedule or peer; "
                 "solid: CuTe backend, dash-dot: Triton backend, dotted: peers; `atomic` and "
                 "the peers other than fa4-det are not deterministic)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--plot", type=Path, help="only redraw the PNG (and table) of a JSON")
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--seqlens", nargs="+", type=int, default=list(SEQLENS))
    parser.add_argument("--masks", nargs="+", default=["full", "causal"])
    parser.add_argument("--backends", nargs="+", default=["cute", "triton"],
                        choices=["cute", "triton"])
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--tag", default="bench_attention")
    parser.add_argument("--time-budget", type=float, default=float("inf"),
                        help="seconds after which no new cell is started")
    args = parser.parse_args(argv)
    if args.plot:
        report = json.loads(args.plot.read_text())
        plot(report, args.plot.with_suffix(".png"))
        args.plot.with_suffix(".md").write_text(markdown(report))
        return 0
    report = run(args)
    save_report(args.out, args.tag, report, markdown(report))
    try:
        plot(report, args.out / f"{args.tag}.png")
    except ImportError:
        print("matplotlib missing: rerun with --plot here", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
