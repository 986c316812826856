#!/usr/bin/env python3
"""Measure the MUFU tables on the GPU and check the models on all 2^32 inputs.

``ex2.approx.ftz.f32`` and ``lg2.approx.ftz.f32`` run in a Triton kernel as inline PTX
(the instructions the CuTe kernels write). Then:

1. the four tables of :mod:`dash_ref.arithmetic.mufu` are read off the hardware at
   :func:`~dash_ref.arithmetic.mufu.table_inputs` (2^23 entries each), plus the NaN each
   instruction writes;
2. every one of the 2^32 fp32 bit patterns goes through the hardware instruction and
   through the model (the same ``dash_ref`` code, on the GPU), and the 32 result bits
   are compared; mismatches are counted by input class, the first ones listed;
3. the tables are encoded as the package ships them and decoded again (must be equal).

Run on the GPU machine from the repository root::

    PYTHONPATH=. python3 scripts/validate_mufu.py --out OUT

Writes ``OUT/mufu_tables.bin`` (the package's table file: copy it to
``dash_ref/arithmetic/``), ``OUT/validate_mufu.json`` and ``OUT/summary.md``. Exit status 0
when both models match every input, 1 otherwise. ``--tables FILE`` validates a table file
instead of measuring one (the shipped tables, for instance).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from dash_ref.arithmetic import mufu

ASM = {"ex2": "ex2.approx.ftz.f32 $0, $1;", "lg2": "lg2.approx.ftz.f32 $0, $1;"}
MODELS = {"ex2": mufu.ex2_approx_ftz, "lg2": mufu.lg2_approx_ftz}
CHUNK = 1 << 28
BLOCK = 1024


@triton.jit
def _mufu_kernel(x_ptr, y_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    """``y = ASM(x)`` elementwise: one instruction of ``ASM`` per fp32 input."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y, mask=mask)


def hardware(op: str, x: torch.Tensor) -> torch.Tensor:
    """The instruction's fp32 results for fp32 ``x`` (on the GPU)."""
    y = torch.full_like(x, float("nan"))
    n = x.numel()
    _mufu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, ASM=ASM[op], BLOCK=BLOCK)
    return y


def sass_of(op: str) -> list[str]:
    """The SASS lines of the measuring kernel that compute (MUFU and float arithmetic): the
    instruction must be a bare MUFU, without the range scaling of the non-.ftz forms."""
    import tempfile

    x = torch.ones(BLOCK, device="cuda")
    compiled = _mufu_kernel[(1,)](x, torch.empty_like(x), BLOCK, ASM=ASM[op], BLOCK=BLOCK)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True,
                              text=True).stdout
    return [" ".join(re.sub(r"/\*.*?\*/", " ", ln).split()) for ln in sass.splitlines()
            if any(k in ln for k in ("MUFU", "FMUL", "FFMA", "FADD", "FSETP", "FSEL"))]


def measure() -> mufu.MufuTables:
    inputs = mufu.table_inputs()
    got = {}
    for name, x in inputs.items():
        y = hardware(name[:3], x.cuda()).cpu()
        got[name] = y.view(torch.int32).clone()
    nan_in = torch.tensor([float("nan")], device="cuda")
    ex2_nan = int(hardware("ex2", nan_in).view(torch.int32).item())
    lg2_nan = int(hardware("lg2", torch.tensor([-1.0], device="cuda")).view(torch.int32).item())
    return mufu.MufuTables(**got, ex2_nan=ex2_nan, lg2_nan=lg2_nan)


def input_class(u: torch.Tensor) -> torch.Tensor:
    """A small integer per input bit pattern (int64, unsigned): see CLASSES."""
    e = (u >> 23) & 0xFF
    man = u & 0x7FFFFF
    neg = (u >> 31) & 1
    cls = torch.full_like(u, 3)  # normal
    cls = torch.where((e == 0) & (man == 0), 0, cls)
    cls = torch.where((e == 0) & (man != 0), 1, cls)
    cls = torch.where((e == 255) & (man == 0), 2, cls)
    cls = torch.where((e == 255) & (man != 0), 4, cls)
    return cls * 2 + neg


CLASSES = [f"{s}{c}" for c in ("zero", "subnormal", "inf", "normal", "nan") for s in "+-"]


def validate(op: str, t: mufu.MufuTables, report_first: int = 16) -> dict:
    tg = t.to("cuda")
    mismatches = 0
    by_class = torch.zeros(len(CLASSES), dtype=torch.int64)
    first: list[dict] = []
    start = time.time()
    for lo in range(-(1 << 31), 1 << 31, CHUNK):
        bits = torch.arange(lo, lo + CHUNK, dtype=torch.int32, device="cuda")
        x = bits.view(torch.float32)
        hw = hardware(op, x).view(torch.int32)
        model = MODELS[op](x, tg).view(torch.int32)
        bad = hw != model
        n_bad = int(bad.sum())
        if n_bad:
            mismatches += n_bad
            u = bits[bad].to(torch.int64) & 0xFFFFFFFF
            by_class += torch.bincount(input_class(u), minlength=len(CLASSES)).cpu()
            for xb, hb, mb in zip(bits[bad][:report_first].tolist(),
                                  hw[bad][:report_first].tolist(),
                                  model[bad][:report_first].tolist()):
                if len(first) < 64:
                    first.append({"x": f"0x{xb & 0xFFFFFFFF:08x}",
                                  "hardware": f"0x{hb & 0xFFFFFFFF:08x}",
                                  "model": f"0x{mb & 0xFFFFFFFF:08x}"})
    return {"instruction": ASM[op].split()[0], "inputs": 1 << 32, "mismatches": mismatches,
            "mismatches_by_class": {c: int(n) for c, n in zip(CLASSES, by_class) if n},
            "first_mismatches": first, "seconds": round(time.time() - start, 1)}


def environment() -> dict:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"gpu": torch.cuda.get_device_name(), "nvidia_smi": smi, "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "cuda": torch.version.cuda}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tables", type=Path, help="validate this table file instead of measuring")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: validate_mufu needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t = mufu.decode_tables(args.tables.read_bytes()) if args.tables else measure()
    blob = mufu.encode_tables(t)
    back = mufu.decode_tables(blob)
    roundtrip = all(torch.equal(getattr(t, n), getattr(back, n)) for n in mufu._NAMES) and (
        (t.ex2_nan, t.lg2_nan) == (back.ex2_nan, back.lg2_nan))
    (args.out / "mufu_tables.bin").write_bytes(blob)
    print(f"tables: {len(blob)} bytes encoded, round trip {'exact' if roundtrip else 'BROKEN'}",
          flush=True)
    results = {op: validate(op, t) for op in ("ex2", "lg2")}
    for r in results.values():
        print(f"{r['instruction']}: {r['mismatches']} mismatches of {r['inputs']} inputs "
              f"({r['seconds']} s) {r['mismatches_by_class']}", flush=True)
        for m in r["first_mismatches"][:8]:
            print("   ", m)
    sass = {op: sass_of(op) for op in ("ex2", "lg2")}
    report = {"command": "PYTHONPATH=. python3 scripts/validate_mufu.py --out OUT"
              + (f" --tables {args.tables}" if args.tables else ""),
              "environment": environment(), "table_bytes": len(blob),
              "table_roundtrip": roundtrip, "ex2_nan": f"0x{t.ex2_nan & 0xFFFFFFFF:08x}",
              "lg2_nan": f"0x{t.lg2_nan & 0xFFFFFFFF:08x}", "results": results, "sass": sass}
    (args.out / "validate_mufu.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["# The MUFU models against the hardware", "",
             f"`{report['command']}` on {report['environment']['gpu']} "
             f"({report['environment']['nvidia_smi']}), torch {torch.__version__}, "
             f"Triton {triton.__version__}.", "",
             "| instruction | inputs | mismatches | seconds |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r['instruction']}` | all 2^32 | {r['mismatches']} | {r['seconds']} |"
              for r in results.values()]
    lines += ["", f"Shipped tables: {len(blob)} bytes (`dash_ref/arithmetic/mufu_tables.bin`), "
              f"round trip {'exact' if roundtrip else 'BROKEN'}.", "",
              "SASS of the measuring kernels (the arithmetic lines):", ""]
    lines += [f"- `{op}`: " + "; ".join(f"`{s}`" for s in found) for op, found in sass.items()]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    ok = roundtrip and all(r["mismatches"] == 0 for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
