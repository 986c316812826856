"""Section 1: three additions, two orders, different bits; what round-to-nearest-even does.

Everything is computed with PyTorch's float32 addition (IEEE binary32, round to nearest,
ties to even) and shown through the bit views of :mod:`dash_ref.arithmetic.numerics`.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import torch

from dash_ref.arithmetic.numerics import bf16_bits, f32_bits, ulp, ulp_distance

from .plot import figure, save

F32 = torch.float32
SPREAD = (0, -9, -18)  # exponent offsets of a, b, c in the search


def _f32(x: float | Fraction) -> torch.Tensor:
    return torch.tensor([float(x)], dtype=F32)


def hex32(x: torch.Tensor) -> str:
    """The bits of a float32 scalar as 8 hex digits."""
    return f"{int(f32_bits(x.reshape(1).to(F32))[0]) & 0xFFFFFFFF:08x}"


def hex16(x: torch.Tensor) -> str:
    """The bits of a bfloat16 scalar as 4 hex digits."""
    return f"{int(bf16_bits(x.reshape(1))[0]) & 0xFFFF:04x}"


def running_sums(values: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[0 + v0, (0 + v0) + v1, ...]``: fp32 additions from +0.0, as a dQ accumulator does."""
    acc = torch.zeros(1, dtype=F32)
    out = []
    for v in values:
        acc = acc + v.to(F32).reshape(1)
        out.append(acc)
    return out


def find_triple(seed: int = 0, tries: int = 100_000) -> tuple[int, torch.Tensor]:
    """The first seeded bf16 triple ``(a, b, c)`` whose fp32 sums in the orders
    ``a, b, c`` and ``c, b, a`` differ; ``a, b, c`` are standard normals scaled by
    ``2**SPREAD``, then rounded to bf16. Returns ``(draw index, values)``."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor([2.0**e for e in SPREAD])
    for t in range(tries):
        x = (torch.randn(3, generator=gen) * scale).to(torch.bfloat16)
        fwd = running_sums([x[0], x[1], x[2]])[-1]
        bwd = running_sums([x[2], x[1], x[0]])[-1]
        if hex32(fwd) != hex32(bwd):
            return t, x
    raise RuntimeError("no triple found")


def exact(values: list[torch.Tensor]) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


def significant_bits(x: Fraction) -> int:
    """Bits from the leading 1 to the last 1 of an exact binary fraction (0 for zero)."""
    if x == 0:
        return 0
    num, den = abs(x.numerator), x.denominator  # den is a power of two
    low = (num & -num).bit_length() - 1 - (den.bit_length() - 1)
    high = num.bit_length() - 1 - (den.bit_length() - 1)
    return high - low + 1


def triple_example(seed: int = 0) -> dict:
    """The example of the page: values, every running sum with its bits, and the errors."""
    t, x = find_triple(seed)
    a, b, c = x[0], x[1], x[2]
    orders = {"abc": [a, b, c], "cba": [c, b, a]}
    true = exact([a, b, c])
    out: dict = {"draw": t, "inputs": {}, "orders": {}, "exact": float(true)}
    for name, v in zip("abc", (a, b, c)):
        out["inputs"][name] = {"value": float(v), "bf16_hex": hex16(v),
                               "f32_hex": hex32(v.to(F32))}
    for name, vals in orders.items():
        sums = running_sums(vals)
        steps = []
        for k, s in enumerate(sums):
            exact_step = exact([sums[k - 1], vals[k]]) if k else Fraction(float(vals[0]))
            steps.append({"value": float(s), "hex": hex32(s),
                          "exact": float(exact_step), "bits": significant_bits(exact_step),
                          "rounded": Fraction(float(s)) != exact_step})
        final = sums[-1]
        err = abs(Fraction(float(final)) - true)
        out["orders"][name] = {
            "steps": steps, "value": float(final), "hex": hex32(final),
            "error_ulp": float(err / Fraction(float(ulp(_f32(true), F32)))),
        }
    out["ulp"] = float(ulp(_f32(true), F32)[0])
    out["ulp_apart"] = int(ulp_distance(_f32(out["orders"]["abc"]["value"]),
                                        _f32(out["orders"]["cba"]["value"]))[0])
    return out


def tie_example() -> dict:
    """``1 + 2**-24 + 2**-24``: two ties that round to even in one order, none in the other."""
    a, b = torch.tensor(1.0, dtype=torch.bfloat16), torch.tensor(2.0**-24, dtype=torch.bfloat16)
    big_first = running_sums([a, b, b])
    small_first = running_sums([b, b, a])
    return {
        "b_value": float(b), "b_bf16_hex": hex16(b),
        "big_first_hex": [hex32(s) for s in big_first],
        "big_first_value": float(big_first[-1]),
        "small_first_hex": [hex32(s) for s in small_first],
        "small_first_value": float(small_first[-1]),
        "next_after_one_hex": hex32(_f32(1 + 2.0**-23)),
    }


def order_statistics(n: int = 100_000, seed: int = 0) -> dict:
    """How often three additions depend on their order, for fp32 and for bf16 summands.

    ``n`` standard-normal triples, summed ``(a + b) + c`` and ``(c + b) + a`` in fp32; the
    fraction whose bits differ, and the fraction that still differ once rounded to bf16.
    """
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(3, n, generator=gen)
    out = {"n": n}
    for label, vals in (("fp32", x), ("bf16", x.to(torch.bfloat16).to(F32))):
        a, b, c = vals
        s1, s2 = (a + b) + c, (c + b) + a
        differ = f32_bits(s1) != f32_bits(s2)
        out[f"{label}_differ"] = int(differ.sum())
        if label == "fp32":
            r1, r2 = s1.to(torch.bfloat16), s2.to(torch.bfloat16)
            out["fp32_differ_after_bf16"] = int((bf16_bits(r1) != bf16_bits(r2)).sum())
            dist = ulp_distance(s1, s2)
            out["one_ulp_apart"] = int((dist == 1).sum())
            out["two_ulp_apart"] = int((dist == 2).sum())
            far = dist > 2
            cancels = s1.abs() < 0.1 * vals.abs().max(0).values  # |sum| < max |term| / 10
            out["far_apart"] = int(far.sum())
            out["far_apart_cancel"] = int((far & cancels).sum())
    return out


# -- figure -----------------------------------------------------------------------------
FIELD_COLORS = {"sign": "#d9d9d9", "exponent": "#9ecae1", "fraction": "#c7e9c0"}


def _bit_row(ax, y: float, hexbits: str, label: str, highlight: set[int] = frozenset()) -> None:
    bits = f"{int(hexbits, 16):032b}"
    for k, ch in enumerate(bits):
        field = "sign" if k == 0 else "exponent" if k < 9 else "fraction"
        ax.add_patch(_rect(k, y, FIELD_COLORS[field], edge="red" if k in highlight else "white",
                           lw=2.0 if k in highlight else 0.5))
        ax.text(k + 0.5, y + 0.45, ch, ha="center", va="center", fontsize=7,
                fontweight="bold" if k in highlight else "normal")
    ax.text(-0.6, y + 0.45, label, ha="right", va="center", fontsize=8, family="monospace")


def _rect(x, y, color, edge="white", lw=0.5):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), 1, 0.9, facecolor=color, edgecolor=edge, linewidth=lw)


def draw(ex: dict, path: Path) -> Path:
    """Two panels: the bits of every running sum in both orders, and the last rounding of
    each order on the fp32 number line."""
    fig = figure(11, 6.8)
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1.5, 1]})
    rows = [(f"a = {ex['inputs']['a']['value']:.9g}", ex["inputs"]["a"]["f32_hex"]),
            (f"b = {ex['inputs']['b']['value']:.9g}", ex["inputs"]["b"]["f32_hex"]),
            (f"c = {ex['inputs']['c']['value']:.9g}", ex["inputs"]["c"]["f32_hex"])]
    sa, sc = ex["orders"]["abc"]["steps"], ex["orders"]["cba"]["steps"]
    rows += [(f"a + b = {sa[1]['value']:.9g}", sa[1]["hex"]),
             (f"(a + b) + c = {sa[2]['value']:.9g}", sa[2]["hex"]),
             (f"c + b = {sc[1]['value']:.9g}", sc[1]["hex"]),
             (f"(c + b) + a = {sc[2]['value']:.9g}", sc[2]["hex"])]
    fa, fc = (f"{int(h, 16):032b}" for h in (sa[2]["hex"], sc[2]["hex"]))
    diff = {k for k in range(32) if fa[k] != fc[k]}
    for n, (label, h) in enumerate(rows):
        y = len(rows) - 1 - n
        _bit_row(top, y, h, label, diff if n in (4, 6) else set())
    for x0, x1, name in ((0, 1, "sign"), (1, 9, "exponent (8)"), (9, 32, "fraction (23)")):
        top.text((x0 + x1) / 2, len(rows) + 0.1, name, ha="center", fontsize=8)
    top.axvline(16, color="black", lw=0.8, ls=":")
    top.text(16.1, -0.55, "bf16 keeps the 16 bits left of the dotted line", fontsize=7)
    top.set_xlim(-14, 32.2)
    top.set_ylim(-0.8, len(rows) + 0.6)
    top.axis("off")
    top.set_title("fp32 bits of the inputs (bf16 values) and of every running sum; "
                  "the bits where the two orders end differently are outlined",
                  fontsize=9, loc="left")

    # number line around the result, in fp32 ulps
    true = ex["exact"]
    u = float(ulp(_f32(true), F32)[0])
    base = float(_f32(true)[0])
    points = [(s["exact"] - base) / u for s in (sa[2], sc[2])]
    points += [(s["value"] - base) / u for s in (sa[2], sc[2])]
    lo, hi = int(min(points)) - 2, int(max(points)) + 2
    for k in range(lo, hi + 1):
        bottom.axvline(k, color="#bbbbbb", lw=0.8, zorder=0)
    marks = [
        ("abc", sa[2], "#4C72B0", 0.55),
        ("cba", sc[2], "#DD8452", -0.55),
    ]
    for name, step, color, y in marks:
        xe = (step["exact"] - base) / u
        xr = (step["value"] - base) / u
        bottom.plot([xe], [y], "o", mfc="white", mec=color, ms=8)
        bottom.plot([xr], [y], "s", color=color, ms=8)
        bottom.annotate("", xy=(xr, y), xytext=(xe, y),
                        arrowprops={"arrowstyle": "->", "color": color, "lw": 1.5})
        label = ("(a + b) + c" if name == "abc" else "(c + b) + a")
        bottom.text(xr, y + 0.25 * (1 if y > 0 else -1.6), f"{label}: exact {xe:+.3f} ulp "
                    f"-> rounds to {xr:+.0f}", color=color, fontsize=8, ha="center")
    bottom.plot([(true - base) / u], [0], "k*", ms=12)
    bottom.text((true - base) / u, 0.15, "exact a + b + c", fontsize=8, ha="center")
    bottom.set_xlim(lo - 0.5, hi + 0.5)
    bottom.set_ylim(-1.3, 1.3)
    bottom.set_yticks([])
    bottom.set_xticks(range(lo, hi + 1))
    bottom.set_xlabel(f"fp32 numbers near the result, in ulps ({u:.3g}) from {base:.9g}; "
                      "circles: exact sum of the last addition, squares: its rounded result",
                      fontsize=8)
    bottom.set_title("the last addition of each order, on the fp32 grid: round to the "
                     "nearest grid point", fontsize=9, loc="left")
    fig.tight_layout()
    return save(fig, path)


def run(out: Path) -> tuple[dict, dict]:
    """Numbers and figures of section 1."""
    ex = triple_example()
    tie = tie_example()
    stats = order_statistics()
    draw(ex, out / "order-bits.png")
    numbers = {
        "order.draw": ex["draw"],
        "order.spread_b": SPREAD[1],
        "order.spread_c": SPREAD[2],
        "order.ulp_apart": ex["ulp_apart"],
        "order.abc_error_ulp": ex["orders"]["abc"]["error_ulp"],
        "order.cba_error_ulp": ex["orders"]["cba"]["error_ulp"],
        "order.n": stats["n"],
        "order.fp32_differ": stats["fp32_differ"],
        "order.fp32_differ_pct": 100 * stats["fp32_differ"] / stats["n"],
        "order.fp32_one_ulp_apart": stats["one_ulp_apart"],
        "order.fp32_one_ulp_pct": 100 * stats["one_ulp_apart"] / stats["fp32_differ"],
        "order.fp32_two_ulp_pct": 100 * stats["two_ulp_apart"] / stats["fp32_differ"],
        "order.fp32_far_cancel_pct": 100 * stats["far_apart_cancel"] / stats["far_apart"],
        "order.fp32_differ_after_bf16": stats["fp32_differ_after_bf16"],
        "order.bf16_differ": stats["bf16_differ"],
        "tie.b": tie["b_value"],
        "tie.b_bf16_hex": tie["b_bf16_hex"],
        "tie.big_first": tie["big_first_value"],
        "tie.small_first": tie["small_first_value"],
        "tie.small_first_hex": tie["small_first_hex"][-1],
        "tie.big_first_hex": tie["big_first_hex"][-1],
    }
    for name in "abc":
        numbers[f"order.{name}"] = ex["inputs"][name]["value"]
        numbers[f"order.{name}_bf16_hex"] = ex["inputs"][name]["bf16_hex"]
    for name in ("abc", "cba"):
        o = ex["orders"][name]
        numbers[f"order.{name}"] = o["value"]
        numbers[f"order.{name}_hex"] = o["hex"]
        for k, s in enumerate(o["steps"]):
            numbers[f"order.{name}.step{k}_hex"] = s["hex"]
            numbers[f"order.{name}.step{k}_rounded"] = "yes" if s["rounded"] else "no"
            numbers[f"order.{name}.step{k}_bits"] = s["bits"]
    numbers["order.exact"] = ex["exact"]
    numbers["order.ulp"] = ex["ulp"]
    return numbers, {"order-bits.png": "three additions in two orders"}
