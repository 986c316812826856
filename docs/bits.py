"""Section 4: the same inputs under every schedule; which bits move, and how accurate each is.

One small problem per mask goes through the tile-level emulator (:func:`dash_ref.emulate.
emulate`) under every schedule, and through exact 50-digit gradients
(:func:`verify.highprec.reference_grads`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import BoundaryNorm, ListedColormap

from dash_ref import NAMES, Problem, build_schedule
from dash_ref.arithmetic.numerics import ulp, ulp_distance, unit_roundoff
from dash_ref.emulate import emulate
from verify.compare import compare
from verify.demo import dq_trace, floored_ulp_error, random_inputs
from verify.highprec import grad_error_reports, reference_grads

from .plot import figure, save

# the problem of ``dash-verify demo`` (same shapes, seed and inputs)
SEQLEN, HEADS, HEADS_KV, D, BLOCK, WORKERS, SEED = 256, 4, 2, 32, 32, 4, 0
PAIR = ("naive", "shift")  # the two schedules of the heatmap and the trace
DTYPE = torch.bfloat16
GRADS = ("dq", "dk", "dv")


def problem(mask: str) -> Problem:
    return Problem(1, HEADS, HEADS_KV, SEQLEN, SEQLEN, D, mask, BLOCK, BLOCK)


def run_mask(mask: str) -> dict:
    """Emulate every schedule (and ``atomic`` twice) on one input set; exact gradients."""
    p = problem(mask)
    q, k, v, do = random_inputs(p, DTYPE, SEED)
    exact = reference_grads(q, k, v, do, causal=mask == "causal", dps=50)
    runs = {}
    for name in NAMES:
        s = build_schedule(p, name, WORKERS).validate()
        runs[name] = (s, emulate(s, q, k, v, do, return_partials=True, arrival_seed=SEED)[1])
    s = runs["atomic"][0]
    runs["atomic'"] = (s, emulate(s, q, k, v, do, arrival_seed=SEED + 1)[1])
    return {"problem": p, "exact": exact, "runs": runs}


def differing(a, b, field: str) -> int:
    return compare(field, getattr(a, field), getattr(b, field)).differing


def numbers_of(mask: str, data: dict) -> dict:
    runs, exact = data["runs"], data["exact"]
    base = runs["naive"][1]
    n = base.dq.numel()
    out: dict = {f"bits.{mask}.numel_{g}": getattr(base, g).numel() for g in GRADS}
    for name, (_, bwd) in runs.items():
        ref = runs["atomic"][1] if name == "atomic'" else base
        key = "atomic_vs_atomic" if name == "atomic'" else name
        for g in GRADS:
            out[f"bits.{mask}.{key}.{g}_acc_differ"] = differing(bwd, ref, f"{g}_acc")
            out[f"bits.{mask}.{key}.{g}_differ"] = differing(bwd, ref, g)
        out[f"bits.{mask}.{key}.dq_acc_differ_pct"] = (
            100 * out[f"bits.{mask}.{key}.dq_acc_differ"] / n)
        if name == "atomic'":
            continue
        reports = grad_error_reports(exact, bwd.dq, bwd.dk, bwd.dv)
        for g, r in reports.items():
            out[f"err.{mask}.{name}.{g}.normwise"] = r.normwise
            out[f"err.{mask}.{g}.bound"] = r.bound
            out[f"err.{mask}.{name}.{g}.ulp"] = floored_ulp_error(
                getattr(bwd, g), getattr(exact, g), DTYPE)
    for g in GRADS:
        vals = [out[f"err.{mask}.{name}.{g}.normwise"] for name in NAMES]
        out[f"err.{mask}.{g}.min"] = min(vals)
        out[f"err.{mask}.{g}.max"] = max(vals)
        out[f"err.{mask}.{g}.spread_pct"] = 100 * (max(vals) / min(vals) - 1)
        out[f"err.{mask}.{g}.bound_over_max"] = out[f"err.{mask}.{g}.bound"] / max(vals)
        out[f"err.{mask}.{g}.max_over_u"] = max(vals) / unit_roundoff(DTYPE)
    a, b = (runs[x][1] for x in PAIR)
    d32 = ulp_distance(a.dq_acc, b.dq_acc)
    d16 = ulp_distance(a.dq, b.dq)
    out[f"bits.{mask}.pair.max_ulp_acc"] = int(d32.max())
    out[f"bits.{mask}.pair.one_ulp_acc_pct"] = 100 * float((d32 == 1).sum() / (d32 > 0).sum())
    out[f"bits.{mask}.pair.max_ulp_out"] = int(d16.max())
    return out


def heatmap(data: dict[str, dict], path: Path) -> Path:
    """ULP distance between the two schedules of :data:`PAIR` for every dQ element:
    one row per (head, d), one column per query row ``s``."""
    masks = list(data)
    fig = figure(12, 2.2 * 2 * len(masks) + 0.4)
    fig.set_layout_engine("constrained")
    axes = fig.subplots(2 * len(masks), 1)
    colors = ListedColormap(["white", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"])
    norm = BoundaryNorm([-0.5, 0.5, 1.5, 2.5, 3.5, 1e9], colors.N)
    k = 0
    for mask in masks:
        a, b = (data[mask]["runs"][x][1] for x in PAIR)
        for label, x, y, fmt in (("fp32 accumulator dQacc", a.dq_acc, b.dq_acc, "fp32"),
                                 ("dQ rounded to bf16", a.dq, b.dq, "bf16")):
            dist = ulp_distance(x[0], y[0]).permute(1, 2, 0).reshape(-1, SEQLEN).numpy()
            ax = axes[k]
            k += 1
            im = ax.imshow(dist, cmap=colors, norm=norm, aspect="auto", interpolation="nearest")
            if fmt == "bf16":
                rows, cols = np.nonzero(dist)
                ax.scatter(cols, rows, s=160, facecolors="none", edgecolors="#7f0000", lw=1.4)
            ax.set_title(f"{mask} mask, {label}: {int((dist > 0).sum())} of {dist.size} "
                         f"elements differ between {PAIR[0]} and {PAIR[1]}"
                         f"{' (circled)' if fmt == 'bf16' else ''}", fontsize=9, loc="left")
            ax.set_yticks([h * D + D / 2 - 0.5 for h in range(HEADS)])
            ax.set_yticklabels([f"head {h}" for h in range(HEADS)], fontsize=7)
            ax.tick_params(labelsize=7)
            for t in range(BLOCK, SEQLEN, BLOCK):
                ax.axvline(t - 0.5, color="#999999", lw=0.5)
            for h in range(1, HEADS):
                ax.axhline(h * D - 0.5, color="#555555", lw=0.8)
    axes[-1].set_xlabel(f"query row s (grey lines: Q tile boundaries, BM = {BLOCK}); "
                        f"within a head, one row per dimension d = 0..{D - 1}", fontsize=8)
    cbar = fig.colorbar(im, ax=list(axes), ticks=[0, 1, 2, 3, 4], shrink=0.4, aspect=15)
    cbar.ax.set_yticklabels(["0", "1", "2", "3", ">= 4"], fontsize=7)
    cbar.set_label("distance in ulps of the format", fontsize=8)
    return save(fig, path)


def bars(numbers: dict, masks: list[str], path: Path) -> Path:
    """Per schedule: elements whose bits differ from ``naive``, before and after rounding."""
    names = [*NAMES[:1], "atomic_vs_atomic", *NAMES[1:]]
    labels = ["atomic", "atomic vs\natomic", *NAMES[1:]]
    fig = figure(12, 3.4 * len(masks))
    axes = fig.subplots(len(masks), 2, squeeze=False)
    x = np.arange(len(names))
    colors = {"dq": "#4C72B0", "dk": "#55A868", "dv": "#C44E52"}
    for row, mask in zip(axes, masks, strict=True):
        for ax, suffix, title in ((row[0], "_acc_differ", "fp32 accumulators"),
                                  (row[1], "_differ", "rounded to bf16")):
            for k, g in enumerate(GRADS):
                vals = [numbers[f"bits.{mask}.{name}.{g}{suffix}"] for name in names]
                if suffix == "_acc_differ":
                    vals = [100 * v / numbers[f"bits.{mask}.numel_{g}"] for v in vals]
                ax.bar(x + (k - 1) * 0.27, vals, 0.27, color=colors[g], label=g)
            ax.set_xticks(x)
            ax.set_xticklabels(labels, fontsize=7)
            ax.set_ylabel("% of elements" if suffix == "_acc_differ" else "elements",
                          fontsize=8)
            ax.set_title(f"{mask} mask, {title}: elements whose bits differ from naive",
                         fontsize=9, loc="left")
            ax.tick_params(labelsize=7)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


def errors(numbers: dict, masks: list[str], path: Path) -> Path:
    """Normwise error of every schedule against mpmath, with the bound, and how many
    rounded elements differ from ``naive``: equally accurate, differently rounded."""
    fig = figure(12, 3.4 * len(masks))
    axes = fig.subplots(len(masks), 1, squeeze=False)[:, 0]
    x = np.arange(len(NAMES))
    colors = {"dq": "#4C72B0", "dk": "#55A868", "dv": "#C44E52"}
    for ax, mask in zip(axes, masks, strict=True):
        for k, g in enumerate(GRADS):
            vals = [numbers[f"err.{mask}.{name}.{g}.normwise"] for name in NAMES]
            ax.bar(x + (k - 1) * 0.27, vals, 0.27, color=colors[g], label=f"{g} error")
            bound = numbers[f"err.{mask}.{g}.bound"]
            ax.hlines(bound, -0.5, len(NAMES) - 0.5, colors=colors[g], linestyles="--", lw=1,
                      label=f"{g} bound")
        top = max(numbers[f"err.{mask}.{g}.bound"] for g in GRADS)
        for n, name in enumerate(NAMES):
            diff = "/".join(str(numbers[f"bits.{mask}.{name}.{g}_differ"]) for g in GRADS)
            ax.text(n, numbers[f"err.{mask}.dq.max"] + 0.04 * top,
                    f"dQ/dK/dV: {diff}\nbf16 elements\n!= naive", ha="center", fontsize=7)
        ax.set_ylim(0, 1.12 * top)
        ax.set_xlim(-0.5, len(NAMES) + 1.3)
        ax.set_xticks(x)
        ax.set_xticklabels(NAMES, fontsize=8)
        ax.set_ylabel("||x - exact|| / ||exact||", fontsize=8)
        ax.set_title(f"{mask} mask: normwise error of dQ, dK, dV under every schedule against "
                     "50-digit mpmath gradients; dashed: the bound of each", fontsize=9,
                     loc="left")
        ax.legend(fontsize=7, loc="center right", ncol=1)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return save(fig, path)


def trace(data: dict) -> tuple[str, dict]:
    """The running fp32 sum of one dQ element whose *rounded* value differs between
    the two schedules of :data:`PAIR`, step by step, and a few numbers about it."""
    (_, a), (_, b) = (data["runs"][x] for x in PAIR)
    div, text = dq_trace(data["runs"][PAIR[0]], data["runs"][PAIR[1]], D, PAIR)
    ra, rb = a.dq[div.element], b.dq[div.element]
    running = [abs(x.running) for x in div.steps_a + div.steps_b]
    final = torch.tensor([div.steps_a[-1].running], dtype=torch.float32)
    other = torch.tensor([div.steps_b[-1].running], dtype=torch.float32)
    numbers = {
        "trace.partials": len(div.steps_a),
        "trace.max_running": max(running),
        "trace.ulp_max_running": float(ulp(torch.tensor(max(running)), torch.float32)),
        "trace.final": div.steps_a[-1].running,
        "trace.ulp_final": float(ulp(final, torch.float32)[0]),
        "trace.ulps_apart": int(ulp_distance(final, other)[0]),
        "trace.bf16_ulps_apart": int(ulp_distance(ra.reshape(1), rb.reshape(1))[0]),
    }
    return text, numbers


def orders(data: dict, b: int = 0, h: int = 0) -> str:
    """The dQ orders of one head under the two schedules of :data:`PAIR`."""
    (sa, _), (sb, _) = (data["runs"][x] for x in PAIR)
    p = sa.problem
    lines = [f"{p.mask} mask, head {h}: dQ order of each Q tile (the j of its partials, "
             "first added first)",
             f"  {'i':>2}  {PAIR[0]:<26}{PAIR[1]}"]
    for i in range(p.n_q):
        oa, ob = (" ".join(map(str, s.dq_order(b, h, i))) for s in (sa, sb))
        lines.append(f"  {i:>2}  {oa:<26}{ob}")
    return "\n".join(lines)


def run(out: Path) -> tuple[dict, dict, dict]:
    """Numbers, figures and transcripts of section 4."""
    data = {mask: run_mask(mask) for mask in ("full", "causal")}
    numbers = {"bits.seqlen": SEQLEN, "bits.heads": HEADS, "bits.heads_kv": HEADS_KV,
               "bits.d": D, "bits.block": BLOCK,
               "bits.workers": WORKERS, "bits.seed": SEED, "bits.partials": SEQLEN // BLOCK}
    for mask, d in data.items():
        numbers.update(numbers_of(mask, d))
    masks = list(data)
    heatmap(data, out / "bits-heatmap.png")
    bars(numbers, masks, out / "bits-vs-naive.png")
    errors(numbers, masks, out / "errors.png")
    text, n = trace(data["full"])
    numbers.update(n)
    transcripts = {"dq_trace": text, "dq_orders": orders(data["causal"])}
    figs = {"bits-heatmap.png": "ULP heatmap", "bits-vs-naive.png": "bits vs naive",
            "errors.png": "errors against mpmath"}
    return numbers, figs, transcripts
