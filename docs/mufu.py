"""Section 6: how the GPU computes exp2 and log2, from the tables ``dash_ref`` ships.

Every number and the figure come from :mod:`dash_ref.arithmetic.mufu` (the models of
``MUFU.EX2`` and ``MUFU.LG2``, validated on all 2^32 inputs on an H200) against exact
values (float64, whose error is far below an fp32 ulp).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dash_ref.arithmetic import mufu

from .plot import figure, save

RANGE = (-2.0, 2.0)


def ulp_error(y: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """``(y - exact) / ulp(exact)`` in fp32 ulps, float64 (``exact`` float64, normal range)."""
    _, e = torch.frexp(exact.abs())
    return (y.double() - exact) / torch.ldexp(torch.ones_like(exact), (e - 24).to(torch.int32))


def sample_inputs(lo: float, hi: float, n: int = 1 << 20) -> torch.Tensor:
    """``n`` seeded fp32 values uniform in ``[lo, hi]``, ascending."""
    gen = torch.Generator().manual_seed(0)
    return (lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)).float().sort()[0]


def run(out: Path) -> tuple[dict, dict]:
    """Numbers and the error figure of section 6."""
    t = mufu.tables()
    x = sample_inputs(*RANGE)
    exact = torch.exp2(x.double())
    err = ulp_error(mufu.ex2_approx_ftz(x), exact)
    rounded = ulp_error(exact.float(), exact)  # a correctly rounded exp2: within 1/2 ulp
    frac = torch.arange(mufu.TABLE_SIZE, dtype=torch.float64) * 2.0**-23
    table_err = torch.cat([ulp_error(t.ex2_pos.view(torch.float32), torch.exp2(frac)),
                           ulp_error(t.ex2_neg.view(torch.float32), torch.exp2(-frac))])
    lg_m = 1.0 + frac
    lg_err = ulp_error(t.lg2_ge1.view(torch.float32)[1:], torch.log2(lg_m[1:]))
    lg_abs = (t.lg2_ge1.view(torch.float32).double() - torch.log2(lg_m)).abs().max()
    numbers = {
        "mufu.samples": int(x.numel()),
        "mufu.ex2_max_ulp": round(float(err.abs().max()), 2),
        "mufu.ex2_exact_share": round(float((err.abs() < 0.5).double().mean()) * 100, 1),
        "mufu.ex2_table_max_ulp": round(float(table_err.abs().max()), 2),
        "mufu.rounded_max_ulp": round(float(rounded.abs().max()), 2),
        "mufu.lg2_max_abs": f"{float(lg_abs):.1e}",
        "mufu.lg2_max_ulp_near_1": int(lg_err.abs().max()),
        "mufu.table_bytes": mufu.TABLE_FILE.stat().st_size,
    }
    pick = torch.arange(0, x.numel(), 5)  # every fifth point keeps the PNG small
    fig = figure(8, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(x[pick].numpy(), err[pick].numpy(), ",", color="#1f77b4", alpha=0.6)
    for y in (-0.5, 0.5):
        ax.axhline(y, color="#d62728", lw=1, ls="--",
                   label="a correctly rounded exp2 stays within these" if y > 0 else None)
    ax.set_xlim(*RANGE)
    ax.set_xlabel("x")
    ax.set_ylabel("error of ex2.approx.ftz.f32 (fp32 ulps)")
    ax.set_title(f"MUFU.EX2 against the exact 2^x: {pick.numel():,} fp32 x in "
                 f"[{RANGE[0]:g}, {RANGE[1]:g}]", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    save(fig, out / "mufu-ex2-error.png")
    return numbers, {"mufu-ex2-error.png": "MUFU.EX2's error in ulps"}
