"""Count the instructions the arithmetic contract names in the compiled backward kernels.

Runs one small backward per variant, then reads the PTX and SASS of every compiled
persistent-backward kernel from Triton's cache and counts the instructions that decide
the bits (``ex2``, ``fma``, the dQ add, atomics, the acquire/release pair, MMAs); the
module docstring of :mod:`dash_cuda.backward` quotes them. Also reports registers and
spills. Writes the PTX and SASS under ``OUT`` when given::

    python -m dash_cuda.inspect_asm [OUT]
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

PTX_PATTERNS = {
    "ex2": r"\bex2\.[a-z0-9.]+",
    "fma": r"\bfma\.[a-z0-9.]+",
    "add.f32": r"\badd\.f32\b",
    "sub.f32": r"\bsub\.f32\b",
    "mul.f32": r"\bmul\.f32\b",
    "cvt.rn": r"\bcvt\.rn\.[a-z0-9.]+",
    "atom": r"\batom\.[a-z0-9.]+",
    "red": r"\bred\.global\.[a-z0-9.]+",
    "ld.acquire": r"\bld\.global\.gpu\.acquire\.[a-z0-9]+",
    "ld.cg": r"\bld\.global\.cg\.[a-z0-9.]+",
    "wgmma": r"\bwgmma\.mma_async\.[a-z0-9._]+",
}
SASS_PATTERNS = {
    "MUFU.EX2": r"\bMUFU\.EX2\b",
    "FFMA": r"\bFFMA\b",
    "FADD": r"\bFADD\b",
    "FMUL": r"\bFMUL\b",
    "HGMMA": r"\bHGMMA\.[A-Z0-9x.]+",
    "REDG": r"\bREDG\.[A-Z0-9.]+",
    "ATOMG": r"\bATOMG\.[A-Z0-9.]+",
    "LDG.STRONG.GPU": r"\bLDG\.E[A-Z0-9.]*\.STRONG\.GPU\b",
    "CCTL.IVALL": r"\bCCTL\.IVALL\b",
    "MEMBAR.GPU": r"\bMEMBAR\.[A-Z.]*GPU\b",
    "F2FP": r"\bF2FP\.[A-Z0-9.]+",
    "STL (spill)": r"\bSTL\b",
}


def count(text: str, patterns: dict[str, str]) -> Counter:
    found: Counter = Counter()
    for name, pattern in patterns.items():
        for match in re.findall(pattern, text):
            found[f"{name}: {match}" if match != name else name] += 1
    return found


def compiled_backward_kernels():
    """Every compiled persistent-backward kernel in this process (Triton 3.6 cache layout)."""
    import torch

    from .bwd_kernel import dash_bwd_kernel

    cache = dash_bwd_kernel.device_caches[torch.cuda.current_device()][0]
    return list(cache.values())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else None
    from .warmup import compile_variant

    for variant in (("bf16", 64, True, True, False, 1), ("bf16", 128, False, True, False, 1),
                    ("bf16", 64, False, False, False, 1)):
        compile_variant(variant)
    for n, kernel in enumerate(compiled_backward_kernels()):
        kernel._init_handles()
        names = kernel.src.fn.arg_names
        flags = {names[k[0]]: v for k, v in kernel.src.constants.items()
                 if names[k[0]] in ("BM", "BN", "HEAD_DIM", "CAUSAL", "DETERMINISTIC")}
        print(f"== backward kernel {n}: {kernel.metadata.num_warps} warps, {kernel.n_regs} "
              f"registers, {kernel.n_spills} spilled, {kernel.metadata.shared} B shared; "
              f"constants {flags}")
        ptx, sass = kernel.asm["ptx"], kernel.asm["sass"]
        for title, found in (("PTX", count(ptx, PTX_PATTERNS)),
                             ("SASS", count(sass, SASS_PATTERNS))):
            print(f"  {title}: " + ", ".join(f"{k} x{v}" for k, v in sorted(found.items())))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"bwd_{n}.ptx").write_text(ptx)
            (out / f"bwd_{n}.sass").write_text(sass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
