"""Packed batches, sliding windows, sinks, softcap and head dims against FlashAttention-4.

Cells (bf16, d = 128, 16 heads, causal):

* ``varlen``: packed batches of 16k and 64k tokens, lengths ``equal`` (2048 each),
  ``uniform`` and ``heavy`` (log-normal; ``model_varlen.lengths``, the mixes the DAG model
  predicts for, fixed seeds), through ``dash_cuda.attention_varlen`` and FlashAttention-4's
  ``flash_attn_varlen_func``;
* ``window``: causal sliding windows ``(w, 0)`` of 256, 1024 and 4096 at S = 8k (B = 2) and
  16k (B = 1), through ``window_size=``;
* ``sinks``: learnable sinks (one float32 logit per head, fresh random, gradients taken) at
  S = 4k (B = 4) and 16k (B = 1), through ``learnable_sink=``;
* ``softcap``: logit softcap 50 (Gemma 2; its 27B model has d = 128) at S = 4k (B = 4), the
  shape of FlashAttention-4's committed anchor, through ``softcap=``;
* ``headdims``: the head dims of FlashAttention-4's committed anchors beyond 128: 192 with
  values of 128 (DeepSeek; causal, S = 4k, B = 4, 16 heads), 256 (Gemma; causal S = 4k and
  full S = 2k, 8 heads) and 256 with softcap 50 (causal S = 4k, B = 2, 8 heads), on each
  backend that runs the cell (``auto`` only: no schedule is made for a head dim;
  ``--schedules NAME ...`` adds those schedules on the backend ``auto`` takes, whose
  timings ``make_auto_table.py --head-dims-report`` turns into ``auto``'s entries for
  these head dims);
* ``headdims-grid``: head dims 96, 192 / 128 and 256, causal, at S = 1k, 4k and 16k with
  16k tokens a batch (B = 16k / S; 16 heads, 8 at 256).

Rows: ``dash_cuda`` on each backend that runs the cell with its ``auto`` schedule, with the
schedule made for the cell's shape (``lpt`` for packed batches, ``banded`` for windows) and
with ``naive`` (the schedule's gain; sink and softcap cells have no schedule of their
own; their ``BACKEND-nosink`` / ``BACKEND-nocap`` rows run the same call without the
feature), and
FlashAttention-4 with ``deterministic=True`` (``fa4-det``) and without (``fa4``). Every row
is timed by plain (eager) calls: a packed call reads its offsets to the host, which a CUDA
graph cannot hold, so no row is replayed (the rows share one offsets tensor, as a model's
layers do, so ``dash_cuda`` reads it once: ``dash_cuda.options.host_offsets``). Each of
``--rounds`` rounds times every row once (``--reps`` calls, CUDA events, median), in an order
that rotates; ratios are taken within a round and reported as medians with their range.
Forward: the call on inputs that require gradients; backward: ``torch.autograd.grad`` of one
forward's output, the graph kept, the same for every row (as a training step runs it);
step: the forward and then the backward, back to back::

    python benchmarks/bench_features.py --out benchmarks/results

Writes ``<tag>.json`` and ``<tag>.md`` (``--tag``, ``bench_features``); ``--plot JSON`` draws
``<tag>.png`` from a report on any machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from harness import (
    environment,
    grad_row,
    grad_step,
    interleaved_rounds,
    no_cuda,
    provenance,
    save_report,
)
from model_varlen import lengths

from dash_ref import DETERMINISTIC

HEAD_DIM, HEADS = 128, 16
VARLEN = [(total, mix) for total in (16384, 65536) for mix in ("equal", "uniform", "heavy")]
WINDOWS = [(s, w) for s in (8192, 16384) for w in (256, 1024, 4096)]
SINKS = [4096, 16384]
SOFTCAP = 50.0
#: (d, d_v, causal, S, B, H, softcap) of the ``headdims`` cells
HEAD_DIM_CELLS = [(192, 128, True, 4096, 4, 16, 0.0), (256, 256, True, 4096, 2, 8, 0.0),
                  (256, 256, False, 2048, 4, 8, 0.0), (256, 256, True, 4096, 2, 8, 50.0)]
#: (d, d_v, heads) of the ``headdims-grid`` cells, each at every length of HEAD_DIM_LENGTHS
HEAD_DIM_GRID = [(96, 96, 16), (192, 128, 16), (256, 256, 8)]
HEAD_DIM_LENGTHS = (1024, 4096, 16384)
KINDS = ["varlen", "window", "sinks", "softcap", "headdims", "headdims-grid"]


def cell_name(cell: dict) -> str:
    if cell["kind"] == "varlen":
        return f"varlen {cell['mix']} {cell['total'] // 1024}k"
    if cell["kind"] == "sinks":
        return f"sinks S={cell['seqlen'] // 1024}k B={cell['batch']}"
    if cell["kind"] == "softcap":
        return f"softcap {cell['softcap']:g} S={cell['seqlen'] // 1024}k B={cell['batch']}"
    if cell["kind"] == "headdims":
        d, dv = cell["head_dim"], cell["head_dim_v"]
        cap = f" softcap {cell['softcap']:g}" if cell["softcap"] else ""
        return (f"d{d}{f'/{dv}' if dv != d else ''}{cap} "
                f"{'causal' if cell['causal'] else 'full'} S={cell['seqlen'] // 1024}k "
                f"B={cell['batch']} H={cell['heads']}")
    return f"window ({cell['window']}, 0) S={cell['seqlen'] // 1024}k B={cell['batch']}"


def cells(kinds: list[str], head_dims: list[int] | None = None) -> list[dict]:
    """The cells of ``kinds`` (``head_dims``: of the head-dim kinds, those head dims only)."""
    out = []
    if "varlen" in kinds:
        out += [{"kind": "varlen", "total": t, "mix": m} for t, m in VARLEN]
    if "window" in kinds:
        out += [{"kind": "window", "seqlen": s, "batch": 16384 // s, "window": w}
                for s, w in WINDOWS]
    if "sinks" in kinds:
        out += [{"kind": "sinks", "seqlen": s, "batch": 16384 // s} for s in SINKS]
    if "softcap" in kinds:
        out += [{"kind": "softcap", "seqlen": 4096, "batch": 4, "softcap": SOFTCAP}]
    if "headdims" in kinds:
        out += [{"kind": "headdims", "head_dim": d, "head_dim_v": dv, "causal": causal,
                 "seqlen": s, "batch": b, "heads": h, "softcap": cap}
                for d, dv, causal, s, b, h, cap in HEAD_DIM_CELLS]
    if "headdims-grid" in kinds:
        out += [{"kind": "headdims", "head_dim": d, "head_dim_v": dv, "causal": True,
                 "seqlen": s, "batch": 16384 // s, "heads": h, "softcap": 0.0}
                for d, dv, h in HEAD_DIM_GRID for s in HEAD_DIM_LENGTHS]
    if head_dims:
        out = [c for c in out if c["kind"] != "headdims" or c["head_dim"] in head_dims]
    return out


def _fa4_varlen():
    try:
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None, None
    return flash_attn_func, flash_attn_varlen_func


#: where the cells' inputs live
DEVICE = "cuda"


def closures(cell: dict, gen, schedules: tuple[str, ...] = ()) -> dict[str, tuple]:
    """``{row: (fwd, bwd, step)}`` of one cell, every row on the same inputs, each on leaves
    of its own that require gradients: ``dash_cuda`` on every installed backend whose
    limits admit the cell's call (:func:`dash_rows`), then FlashAttention-4's two rows
    (``schedules``: a head-dim cell's schedules beside ``auto``)."""
    fa, fa_varlen = _fa4_varlen()
    if cell["kind"] == "headdims":
        return _head_dim_rows(cell, gen, fa, schedules)
    return {"varlen": _varlen_rows, "window": _window_rows, "sinks": _feature_rows,
            "softcap": _feature_rows}[cell["kind"]](
                cell, gen, fa_varlen if cell["kind"] == "varlen" else fa)


def _randn(gen, *shape):
    import torch

    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=torch.bfloat16)


def _leaves(*xs) -> tuple:
    return tuple(x.detach().requires_grad_() for x in xs)


def dash_rows(case, schedules: tuple[str, ...], call, inputs: tuple, do,
              backends: tuple[str, ...] | None = None) -> dict[str, tuple]:
    """``BACKEND:SCHEDULE`` rows: ``call(leaves, backend, schedule)``, ``dash_cuda`` on
    fresh leaves of ``inputs``, for every installed backend (in ``"auto"``'s order; or
    those of ``backends``) whose limits admit ``case`` (:func:`dash_cuda.backends.limit`)
    and every schedule."""
    from dash_cuda.backends import PREFERENCE, get_backend, limit

    rows: dict[str, tuple] = {}
    for backend in PREFERENCE if backends is None else backends:
        chosen = get_backend(backend)
        if chosen.missing() or limit(chosen, case):
            continue
        for schedule in schedules:
            x = _leaves(*inputs)
            rows[f"{backend}:{schedule}"] = _row(
                lambda x=x, b=backend, s=schedule: call(x, b, s), x, do)
    return rows


def _varlen_rows(cell: dict, gen, fa_varlen) -> dict[str, tuple]:
    """A packed batch: ``auto``, ``lpt`` and ``naive`` on each backend, FlashAttention-4
    varlen."""
    import torch

    import dash_cuda
    from dash_cuda.backends import Case

    seqlens = lengths(cell["mix"], cell["total"])
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32,
                      device=DEVICE)
    longest = max(seqlens)
    q, k, v, do = (_randn(gen, cell["total"], HEADS, HEAD_DIM) for _ in range(4))
    cell["sequences"], cell["longest"] = len(seqlens), longest
    offsets = (cu, cu, longest, longest)
    rows = dash_rows(Case(HEAD_DIM, torch.bfloat16, False, True, packed=True),
                     ("auto", "lpt", "naive"),
                     lambda x, b, s: dash_cuda.attention_varlen(
                         *x, *offsets, causal=True, schedule=s, backend=b), (q, k, v), do)
    if fa_varlen is not None:
        rows.update(fa4_rows(lambda *x, det: fa_varlen(
            *x, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
            max_seqlen_k=longest, causal=True, deterministic=det), (q, k, v), do))
    return rows


def _window_rows(cell: dict, gen, fa) -> dict[str, tuple]:
    """A causal window ``(w, 0)``: ``auto``, ``banded`` and ``naive`` on each backend."""
    import torch

    import dash_cuda
    from dash_cuda.backends import Case

    b, s, w = cell["batch"], cell["seqlen"], cell["window"]
    q, k, v, do = (_randn(gen, b, s, HEADS, HEAD_DIM) for _ in range(4))
    rows = dash_rows(Case(HEAD_DIM, torch.bfloat16, False, True, window=True),
                     ("auto", "banded", "naive"),
                     lambda x, bk, sc: dash_cuda.attention(
                         *x, causal=True, window_size=(w, 0), schedule=sc, backend=bk),
                     (q, k, v), do)
    if fa is not None:
        rows.update(fa4_rows(lambda *x, det: fa(*x, causal=True, window_size=(w, None),
                                                deterministic=det), (q, k, v), do))
    return rows


def _feature_rows(cell: dict, gen, fa) -> dict[str, tuple]:
    """A sink or softcap cell: ``auto`` and ``naive`` on each backend that computes the
    feature, and ``BACKEND-nosink`` / ``BACKEND-nocap``: ``auto`` without it (what it
    costs; no candidate for ours' row). The sink logits are leaves of every sink row's
    gradient, as a model trains them."""
    import torch

    import dash_cuda
    from dash_cuda.backends import Case

    b, s = cell["batch"], cell["seqlen"]
    q, k, v, do = (_randn(gen, b, s, HEADS, HEAD_DIM) for _ in range(4))
    sinks = cell["kind"] == "sinks"
    if sinks:
        extra = (torch.randn(HEADS, generator=gen, device=DEVICE, dtype=torch.float32),)
        without = "nosink"

        def keywords(x):  # the sinks are the fourth leaf
            return {"learnable_sink": x[3]}
    else:
        extra, without = (), "nocap"

        def keywords(x):
            return {"softcap": cell["softcap"]}
    case = Case(HEAD_DIM, torch.bfloat16, False, True, softcap=not sinks, sink=sinks)
    rows = dash_rows(case, ("auto", "naive"),
                     lambda x, bk, sc: dash_cuda.attention(
                         *x[:3], causal=True, schedule=sc, backend=bk, **keywords(x)),
                     (q, k, v, *extra), do)
    for backend in [name.partition(":")[0] for name in rows if name.endswith(":auto")]:
        # the same call without the feature, on the backends that ran it with
        x = _leaves(q, k, v)
        rows[f"{backend}-{without}"] = _row(
            lambda bk=backend, x=x: dash_cuda.attention(*x, causal=True, backend=bk), x, do)
    if fa is not None:
        rows.update(fa4_rows(lambda *x, det: fa(*x[:3], causal=True, deterministic=det,
                                                **keywords(x)), (q, k, v, *extra), do))
    return rows


def _head_dim_rows(cell: dict, gen, fa, schedules: tuple[str, ...] = ()) -> dict[str, tuple]:
    """A head-dim cell: ``auto`` on each backend that runs it (no schedule is made for a
    head dim), and ``schedules`` on the backend ``auto`` takes."""
    import torch

    import dash_cuda
    from dash_cuda.backends import Case

    d, dv, causal, cap = cell["head_dim"], cell["head_dim_v"], cell["causal"], cell["softcap"]
    b, s, h = cell["batch"], cell["seqlen"], cell["heads"]
    q, k = (_randn(gen, b, s, h, d) for _ in range(2))
    v, do = (_randn(gen, b, s, h, dv) for _ in range(2))
    case = Case(d, torch.bfloat16, False, True, softcap=cap > 0,
                head_dim_v=None if dv == d else dv)
    def call(x, bk, sc):
        return dash_cuda.attention(*x, causal=causal, softcap=cap, schedule=sc, backend=bk)

    rows = dash_rows(case, ("auto",), call, (q, k, v), do)
    if schedules and rows:
        from dash_cuda.backends import choose_backend

        rows.update(dash_rows(case, schedules, call, (q, k, v), do,
                              backends=(choose_backend("auto", case).name,)))
    if fa is not None:
        rows.update(fa4_rows(lambda *x, det: fa(*x, causal=causal, softcap=cap,
                                                deterministic=det), (q, k, v), do))
    return rows


def _row(fwd, inputs: tuple, do) -> tuple:
    """``(fwd, bwd, step)`` of one row: :func:`harness.grad_row`'s forward and backward, and
    a training step's forward then backward (:func:`harness.grad_step`)."""
    return (*grad_row(fwd, inputs, do), grad_step(fwd, inputs, do))


def fa4_rows(call, inputs: tuple, do) -> dict[str, tuple]:
    """The ``fa4-det`` and ``fa4`` rows: ``call(*leaves, det=...)``, FlashAttention-4 with and
    without ``deterministic=True``, each on fresh leaves of ``inputs``
    (:func:`harness.grad_row`)."""
    def row(det):
        x = _leaves(*inputs)

        def fwd():
            out = call(*x, det=det)
            return out[0] if isinstance(out, tuple) else out
        return _row(fwd, x, do)

    return {"fa4-det": row(True), "fa4": row(False)}


def run(args) -> dict:
    import torch

    report = {**provenance("bench_features.py", args.argv), "environment": environment(args),
              "cells": []}
    gen = torch.Generator(device="cuda").manual_seed(0)
    start = time.monotonic()
    for cell in cells(args.kinds, args.head_dims):
        if time.monotonic() - start > args.time_budget:
            print(f"time budget spent: {cell_name(cell)} and later cells left out")
            break
        rows = closures(cell, gen, tuple(args.schedules))
        for fwd, bwd, step in rows.values():  # compile and warm every row before any timing
            for _ in range(args.warmup):
                fwd()
                bwd()
                step()
        torch.cuda.synchronize()
        cell["ms"] = {}
        for part, index in (("backward", 1), ("forward", 0), ("step", 2)):
            cell["ms"][part] = interleaved_rounds({r: f[index] for r, f in rows.items()},
                                                  args.rounds, args.reps)
        cell["median_ms"] = {part: {r: round(statistics.median(t), 4) for r, t in ms.items()}
                             for part, ms in cell["ms"].items()}
        print(f"{cell_name(cell)}: {cell['median_ms']}", flush=True)
        report["cells"].append(cell)
    return report


def ratio(cell: dict, part: str, ours: str, peer: str) -> str:
    """Median (min - max) over the rounds of ``peer``'s time over ``ours``."""
    ms = cell["ms"].get(part, {})  # reports before the step part have none
    if ours not in ms or peer not in ms:
        return "-"
    values = [p / o for o, p in zip(ms[ours], ms[peer])]
    return f"{statistics.median(values):.2f} ({min(values):.2f} - {max(values):.2f})"


def best_dash(cell: dict) -> str | None:
    """The deterministic ``dash_cuda`` row of lowest median backward time over the rounds
    (one choice per cell, ``naive`` aside)."""
    ours = [r for r in cell["median_ms"]["backward"] if ":" in r and not r.endswith(":naive")]
    return min(ours, key=cell["median_ms"]["backward"].get) if ours else None


MODELS = Path(__file__).parent / "results"


def made_for(cell: dict) -> str:
    """The schedule made for the cell's shape: ``lpt`` (packed) or ``banded`` (windows)."""
    return {"varlen": "lpt", "window": "banded"}.get(cell["kind"], "auto")


def model_gain(cell: dict) -> str:
    """The DAG model's prediction of ``naive`` over :func:`made_for` (the simulator with the
    calibrated hand-off latency; ``model_varlen.json``, ``model_window.json``)."""
    stem = {"varlen": "model_varlen", "window": "model_window"}.get(cell["kind"])
    path = MODELS / f"{stem}.json"
    if stem is None or not path.is_file():
        return "-"
    for row in json.loads(path.read_text())["rows"]:
        if cell["kind"] == "varlen":
            hit = (row["tokens"], row["mix"]) == (cell["total"], cell["mix"])
        else:
            hit = (row["S"], row["window_size"]) == (cell["seqlen"], [cell["window"], 0])
        if hit:
            return f"{row['sim']['naive'] / row['sim'][made_for(cell)]:.2f}"
    return "-"


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# Packed batches, sliding windows, sinks, softcap and head dims against "
        "FlashAttention-4",
        "",
        f"`{report['command']}` at `{report['git_revision']}`, {env['gpu']}, torch "
        f"{env['torch']}, triton {env['triton']}. bf16; d = 128, 16 heads, causal where the "
        "cell does not say otherwise. Every "
        "row timed by eager calls (a packed call reads its offsets to the host, which a CUDA "
        "graph cannot hold; the rows share one offsets tensor, as a model's layers do), "
        "backward by `torch.autograd.grad` of one forward's output for every row, "
        f"{env['reps']} calls per round, interleaved rounds; ms are "
        "medians over the rounds; ratios are the peer's time over ours within a round, "
        "median (range). `BACKEND:auto` is the schedule `dash_cuda` picks, `lpt` and "
        "`banded` the schedules made for packed batches and bands (a sink or softcap cell: `auto` "
        "itself), `naive` the baseline "
        "order; `fa4-det` is FlashAttention-4 with `deterministic=True`; a `step` is the "
        "forward and then the backward of one call, back to back, as a training step runs "
        "them (`-`: a report from before steps were timed).",
        "",
        "| cell | rows (backward ms) | fa4-det / ours | fa4 / ours | naive / lpt or banded "
        "(measured) | (model) | forward: fa4 / ours | step: fa4-det / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in report["cells"]:
        ours = best_dash(cell)
        bwd = cell["median_ms"]["backward"]
        shown = ", ".join(f"{r} {t:.3f}" for r, t in bwd.items())
        backend = ours.split(":")[0] if ours else None
        gain = (ratio(cell, "backward", f"{backend}:{made_for(cell)}", f"{backend}:naive")
                if ours else "-")
        lines.append(
            f"| {cell_name(cell)} | {shown} | {ratio(cell, 'backward', ours, 'fa4-det')} | "
            f"{ratio(cell, 'backward', ours, 'fa4')} | {gain} | {model_gain(cell)} | "
            f"{ratio(cell, 'forward', ours, 'fa4')} | {ratio(cell, 'step', ours, 'fa4-det')} |")
    lines += ["", "Above 1: ours is faster. `ours` is the deterministic `dash_cuda` row of "
              "lowest median backward time in the cell (`naive` aside), chosen once per cell. "
              "`naive / lpt or banded`: on ours' backend, the schedule made for the shape "
              "against `naive`, measured, and as the DAG model's simulator predicts it "
              "(`model_varlen.md`, `model_window.md`: 64 x 128 tiles, W = 132, calibrated "
              "hand-off latency)."]
    return "\n".join(lines) + "\n"


def plot(path: Path) -> Path:
    """``bench_features.png`` beside ``path``: each row's backward speed relative to
    FlashAttention-4 deterministic (its time over the row's; above 1 is faster), ``naive``
    left out (its bars would flatten the rest; the table has it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(path.read_text())
    cells_ = [c for c in report["cells"] if "fa4-det" in c["median_ms"]["backward"]]
    rows = sorted({r for c in cells_ for r in c["median_ms"]["backward"]
                   if r != "fa4-det" and not r.endswith(":naive")})
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(cells_)), 4.5))
    width = 0.8 / len(rows)
    for n, row in enumerate(rows):
        xs, ys = [], []
        for i, c in enumerate(cells_):
            bwd = c["median_ms"]["backward"]
            if row in bwd:
                xs.append(i + n * width)
                ys.append(bwd["fa4-det"] / bwd[row])
        ax.bar(xs, ys, width, label=row)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cells_))])
    ax.set_xticklabels([cell_name(c) for c in cells_], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("backward speed / FA4 deterministic")
    ax.set_title(f"Packed batches, windows, sinks, softcap and head dims, backward, H200, "
                 f"bf16 (git {report['git_revision']})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    parser.add_argument("--tag", default="bench_features", help="the report's file stem")
    parser.add_argument("--head-dims", type=int, nargs="+", default=None,
                        help="the head-dim cells of these head dims only")
    parser.add_argument("--schedules", nargs="+", default=[], choices=DETERMINISTIC,
                        help="the head-dim cells: these schedules too, on the backend "
                             "auto takes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--time-budget", type=float, default=float("inf"),
                        help="seconds after which no new cell starts")
    parser.add_argument("--plot", type=Path, default=None,
                        help="draw the PNG of a committed JSON report and exit")
    args = parser.parse_args(argv)
    args.argv = argv
    if args.plot is not None:
        if not args.plot.is_file():
            print(f"bench_features: --plot: no such report {args.plot}", file=sys.stderr)
            return 2
        print(plot(args.plot))
        return 0
    if args.rounds < 1 or args.reps < 1 or args.warmup < 1:
        print("bench_features: --rounds, --reps and --warmup must be >= 1", file=sys.stderr)
        return 2
    if no_cuda("bench_features"):
        return 2
    report = run(args)
    save_report(args.out, args.tag, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
