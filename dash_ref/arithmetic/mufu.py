"""Bit-exact models of the special-function unit: ``ex2.approx.ftz.f32`` and ``lg2.approx.ftz.f32``.

The kernels' fast arithmetic takes ``exp2`` and ``log2`` from the multi-function unit
(SASS ``MUFU.EX2``, ``MUFU.LG2``), whose results are approximate and documented only to a
few ulps. Both are reproduced here bit for bit from tables measured on the GPU
(``scripts/validate_mufu.py``, which also compares the models with the hardware on all
2^32 inputs: ``benchmarks/results/mufu_validation/``).

``ex2.approx.ftz.f32`` (:func:`ex2_approx_ftz`), as a sign-magnitude fixed-point unit:

1. a subnormal input is a zero (``.ftz``); ``|x|`` is cut to 23 fractional bits (truncated):
   ``|x| = n + f 2^-23`` with an integer ``n`` and ``0 <= f < 2^23``;
2. ``y = T_s[f] * 2^(+n)`` for ``x >= 0``, ``T_s[f] * 2^(-n)`` for ``x < 0``, where ``T_+[f]``
   is the hardware's ``ex2(f 2^-23)`` and ``T_-[f]`` its ``ex2(-f 2^-23)`` (one table per
   sign, read off the GPU); the scaling is exact;
3. a result below the normal range is ``+0`` (``.ftz``), above it ``+inf``; ``+inf`` gives
   ``+inf``, ``-inf`` gives ``+0``, a NaN the hardware's NaN.

``lg2.approx.ftz.f32`` (:func:`lg2_approx_ftz`): for ``x = 2^e m`` (``1 <= m < 2``) the
exact sum of an integer and a per-mantissa table value, rounded toward zero:
``y = RZ(e + L_1[m])`` for ``x >= 1`` and ``y = RZ((e + 1) + L_0[m])`` for ``x < 1``, where
``L_1[m]`` is the hardware's ``log2(m)`` and ``L_0[m]`` its ``log2(m / 2)``. Zeros and
subnormals give ``-inf``, negative inputs and NaN the hardware's NaN, ``+inf`` gives ``+inf``.

Every function works on any device (plain integer tensor arithmetic on the bit patterns),
so the exhaustive validation runs the same code on the GPU that the CPU emulation runs.
The tables ship in ``mufu_tables.bin`` (:func:`tables`), compressed.
"""

from __future__ import annotations

import contextlib
import lzma
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

__all__ = ["TABLE_SIZE", "MufuTables", "decode_tables", "encode_tables", "ex2_approx_ftz",
           "lg2_approx_ftz", "table_inputs", "tables", "using"]

#: entries per table: one per 23-bit fraction (ex2) or mantissa (lg2)
TABLE_SIZE = 1 << 23
TABLE_FILE = Path(__file__).with_name("mufu_tables.bin")
_MAGIC = b"DASHMUFU1"
_NAMES = ("ex2_pos", "ex2_neg", "lg2_ge1", "lg2_lt1")
_I64 = torch.int64
_POS_INF = 0x7F800000
_NEG_INF = 0xFF800000


@dataclass(frozen=True)
class MufuTables:
    """The measured tables (int32 bit patterns, :data:`TABLE_SIZE` each) and NaN results.

    ``ex2_pos[f]``: ``ex2(f 2^-23)``; ``ex2_neg[f]``: ``ex2(-f 2^-23)``;
    ``lg2_ge1[f]``: ``lg2(1 + f 2^-23)``; ``lg2_lt1[f]``: ``lg2((1 + f 2^-23) / 2)``.
    ``ex2_nan`` / ``lg2_nan``: the bits each writes for a NaN input (and ``lg2`` for a
    negative one).
    """

    ex2_pos: torch.Tensor
    ex2_neg: torch.Tensor
    lg2_ge1: torch.Tensor
    lg2_lt1: torch.Tensor
    ex2_nan: int
    lg2_nan: int

    def to(self, device: torch.device | str) -> MufuTables:
        """The same tables on ``device``."""
        return MufuTables(*(getattr(self, n).to(device) for n in _NAMES), self.ex2_nan,
                          self.lg2_nan)


def table_inputs() -> dict[str, torch.Tensor]:
    """The fp32 inputs each table entry is measured at (``float32``, :data:`TABLE_SIZE`)."""
    f = torch.arange(TABLE_SIZE, dtype=torch.int32)
    frac = f.to(torch.float32) * 2.0**-23  # exact: at most 23 significant bits
    return {"ex2_pos": frac, "ex2_neg": -frac,
            "lg2_ge1": (f | (127 << 23)).view(torch.float32),
            "lg2_lt1": (f | (126 << 23)).view(torch.float32)}


# -- the shipped tables ---------------------------------------------------------------------
# Each table is monotone and smooth: stored as second differences of its bit patterns
# (small integers, mostly repeating), int8 where they fit, then LZMA.
def encode_tables(t: MufuTables) -> bytes:
    """The compact form of ``t`` (what ``mufu_tables.bin`` holds)."""
    parts = [struct.pack("<II", t.ex2_nan & 0xFFFFFFFF, t.lg2_nan & 0xFFFFFFFF)]
    for name in _NAMES:
        bits = getattr(t, name).to(_I64).numpy()
        d2 = np.diff(bits, n=2, prepend=[0, 0])  # d2[0] = b0, d2[1] = b1 - 2 b0
        head, body = d2[:2], d2[2:]
        wide = int(np.abs(body).max()) > 127
        raw = body.astype(np.int32 if wide else np.int8).tobytes()
        parts.append(struct.pack("<qqB", int(head[0]), int(head[1]), wide) + raw)
    return _MAGIC + lzma.compress(b"".join(parts), preset=9 | lzma.PRESET_EXTREME)


def decode_tables(blob: bytes) -> MufuTables:
    """:class:`MufuTables` from :func:`encode_tables`'s bytes."""
    if not blob.startswith(_MAGIC):
        raise ValueError("not a MUFU table file (bad magic)")
    data = lzma.decompress(blob[len(_MAGIC):])
    ex2_nan, lg2_nan = struct.unpack_from("<II", data, 0)
    pos, out = 8, {}
    for name in _NAMES:
        h0, h1, wide = struct.unpack_from("<qqB", data, pos)
        pos += 17
        width = 4 if wide else 1
        body = np.frombuffer(data, np.int32 if wide else np.int8, TABLE_SIZE - 2, pos)
        pos += width * (TABLE_SIZE - 2)
        d2 = np.concatenate([[h0, h1], body.astype(np.int64)])
        bits = np.cumsum(np.cumsum(d2))
        out[name] = torch.from_numpy(bits.astype(np.int64)).to(torch.int32)
    return MufuTables(**out, ex2_nan=_signed(ex2_nan), lg2_nan=_signed(lg2_nan))


@lru_cache(maxsize=1)
def tables() -> MufuTables:
    """The tables measured on an H200, from the package (decoded once)."""
    return decode_tables(TABLE_FILE.read_bytes())


_active: list[MufuTables] = []  # tables installed by :func:`using`, innermost last


@contextlib.contextmanager
def using(t: MufuTables) -> Iterator[MufuTables]:
    """Within the block, the models (and every step that calls them) use ``t``: tables
    measured on another GPU, or altered ones for a negative control."""
    _active.append(t)
    try:
        yield t
    finally:
        _active.pop()


@lru_cache(maxsize=8)
def _tables_on(device: str) -> MufuTables:
    return tables().to(device)


def _resolve(t: MufuTables | None, x: torch.Tensor) -> MufuTables:
    if t is None:
        if not _active:
            return _tables_on(str(x.device))
        t = _active[-1]
    return t if t.ex2_pos.device == x.device else t.to(x.device)


def _signed(u: int) -> int:
    return u - (1 << 32) if u >= 1 << 31 else u


def _fields(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(bits, sign, biased exponent, fraction)`` of fp32 ``x``, as int64 (sign: bool)."""
    if x.dtype != torch.float32:
        raise TypeError(f"expected float32, got {x.dtype}")
    u = x.contiguous().view(torch.int32).to(_I64) & 0xFFFFFFFF
    return u, (u >> 31) == 1, (u >> 23) & 0xFF, u & 0x7FFFFF


def _as_f32(u: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit patterns -> float32 with those bits."""
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32).view(torch.float32)


# -- ex2 -----------------------------------------------------------------------------------
def ex2_approx_ftz(x: torch.Tensor, t: MufuTables | None = None) -> torch.Tensor:
    """``ex2.approx.ftz.f32`` (``MUFU.EX2``) of fp32 ``x``, bit for bit, on ``x``'s device."""
    t = _resolve(t, x)
    u, neg, e, man = _fields(x)
    sig = torch.where(e == 0, torch.zeros_like(man), man | 0x800000)  # .ftz: zeros
    shift = (e - 127).clamp(-40, 9)  # |x| >= 2^9 saturates either way
    fixed = torch.where(shift >= 0, sig << shift.clamp(min=0), sig >> (-shift).clamp(min=0))
    n, f = fixed >> 23, fixed & 0x7FFFFF  # |x| * 2^23, truncated: integer and fraction
    tb = torch.where(neg, t.ex2_neg[f], t.ex2_pos[f]).to(_I64)
    exp_out = ((tb >> 23) & 0xFF) + torch.where(neg, -n, n)
    y = (tb & 0x7FFFFF) | (exp_out.clamp(0, 255) << 23)
    y = torch.where(exp_out <= 0, torch.zeros_like(y), y)  # below the normal range: +0
    y = torch.where(exp_out >= 255, torch.full_like(y, _POS_INF), y)
    special = e == 255
    y = torch.where(special & neg, torch.zeros_like(y), y)
    y = torch.where(special & ~neg, torch.full_like(y, _POS_INF), y)
    y = torch.where(special & (man != 0), torch.full_like(y, t.ex2_nan & 0xFFFFFFFF), y)
    return _as_f32(y)


# -- lg2 -----------------------------------------------------------------------------------
_FIX = 50  # binary places of the exact sum e + L (table values are multiples of 2^-47)


def lg2_approx_ftz(x: torch.Tensor, t: MufuTables | None = None) -> torch.Tensor:
    """``lg2.approx.ftz.f32`` (``MUFU.LG2``) of fp32 ``x``, bit for bit, on ``x``'s device."""
    t = _resolve(t, x)
    u, neg, e, man = _fields(x)
    unbiased = e - 127
    ge1 = unbiased >= 0
    tb = torch.where(ge1, t.lg2_ge1[man], t.lg2_lt1[man]).to(_I64)
    whole = torch.where(ge1, unbiased, unbiased + 1)  # same sign as the table value
    # |table value| * 2^_FIX, truncated (exact for every measured value, see _FIX)
    t_exp = (tb >> 23) & 0xFF
    t_sig = torch.where(t_exp == 0, tb & 0x7FFFFF, (tb & 0x7FFFFF) | 0x800000)
    sh = t_exp - 150 + _FIX
    t_mag = torch.where(sh >= 0, t_sig << sh.clamp(0, 40), t_sig >> (-sh).clamp(0, 63))
    mag = (whole.abs() << _FIX) + t_mag
    # round toward zero to 24 significant bits: the position of the top bit, then a shift
    top = torch.floor(torch.log2(mag.clamp(min=1).double())).to(_I64)
    one = torch.ones_like(top)
    top = torch.where((one << top) > mag, top - 1, top)
    top = torch.where((one << (top + 1)) <= mag, top + 1, top)
    kept = mag >> (top - 23).clamp(min=0)
    sign = torch.where(whole < 0, torch.full_like(u, 1 << 31), torch.zeros_like(u))
    y = sign | ((top - _FIX + 127) << 23) | (kept & 0x7FFFFF)
    y = torch.where(whole == 0, tb & 0xFFFFFFFF, y)  # e + 1 = 0 or e = 0: the table itself
    y = torch.where(e == 0, torch.full_like(y, _NEG_INF), y)  # zeros, subnormals (.ftz)
    y = torch.where((e == 255) & ~neg, torch.full_like(y, _POS_INF), y)
    bad = (neg & (e != 0)) | ((e == 255) & (man != 0))  # negative, -inf, NaN
    y = torch.where(bad, torch.full_like(y, t.lg2_nan & 0xFFFFFFFF), y)
    return _as_f32(y)
