"""Count the instructions the arithmetic contract names in the compiled backward kernels.

Compiles the persistent backward and the ``D`` preprocess for sm_90 with Triton's own
compiler and ``ptxas`` (no GPU needed: the target is given, not queried), then counts in
the PTX and SASS the instructions that decide the bits (``ex2``, ``fma``, the dQ add,
atomics, the acquire/release pair, MMAs, ``.ftz`` variants); :mod:`.contract` quotes
them. Writes the PTX and SASS under ``OUT`` when given::

    python -m dash_cuda.backends.triton.inspect_asm [OUT]

The launch-time specializations (which integer arguments are multiples of 16) are not
reproduced, so addressing code may differ slightly from what a run compiles; the
floating-point operations do not depend on them.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PTX_PATTERNS = {
    "ex2": r"\bex2\.[a-z0-9.]+",
    "fma": r"\bfma\.[a-z0-9.]+",
    "add": r"(?<![.\w])add\.(?:rn\.)?(?:ftz\.)?f32\b",
    "sub": r"\bsub\.(?:rn\.)?(?:ftz\.)?f32\b",
    "mul": r"\bmul\.(?:rn\.)?(?:ftz\.)?f32\b",
    "cvt.rn": r"\bcvt\.rn\.[a-z0-9.]+",
    "cvt.rni": r"\bcvt\.rni\.[a-z0-9.]+",
    "atom": r"\batom\.[a-z0-9.]+",
    "red": r"\bred\.global\.[a-z0-9.]+",
    "ld.acquire": r"\bld\.global\.gpu\.acquire\.[a-z0-9]+",
    "ld.cg": r"\bld\.global\.cg\.[a-z0-9.]+",
    "wgmma": r"\bwgmma\.mma_async\.[a-z0-9._]+",
}
SASS_PATTERNS = {
    "MUFU.EX2": r"\bMUFU\.EX2\b",
    "FFMA": r"\bFFMA(?:\.[A-Z0-9]+)*",
    "FADD": r"\bFADD(?:\.[A-Z0-9]+)*",
    "FMUL": r"\bFMUL(?:\.[A-Z0-9]+)*",
    "FRND": r"\bFRND(?:\.[A-Z0-9]+)*",
    "FMNMX": r"\bFMNMX(?:\.[A-Z0-9]+)*",
    "HGMMA": r"\bHGMMA\.[A-Z0-9x.]+",
    "REDG": r"\bREDG\.[A-Z0-9.]+",
    "ATOMG": r"\bATOMG\.[A-Z0-9.]+",
    "LDG.STRONG.GPU": r"\bLDG\.E[A-Z0-9.]*\.STRONG\.GPU\b",
    "CCTL.IVALL": r"\bCCTL\.IVALL\b",
    "MEMBAR.GPU": r"\bMEMBAR\.[A-Z.]*GPU\b",
    "F2FP": r"\bF2FP\.[A-Z0-9.]+",
    "STL (spill)": r"\bSTL\b",
}
#: floating-point arithmetic in SASS that would flush subnormals (none is expected in the
#: exact kernels; the dQ ``REDG...FTZ`` of the default hand-off is not arithmetic here)
SASS_FTZ_ARITH = r"\b(?:FADD|FMUL|FFMA|FRND|FMNMX|MUFU\.[A-Z0-9]+)(?:\.[A-Z0-9]+)*\.FTZ\b"


def count(text: str, patterns: dict[str, str]) -> Counter:
    found: Counter = Counter()
    for name, pattern in patterns.items():
        for match in re.findall(pattern, text):
            found[f"{name}: {match}" if match != name else name] += 1
    return found


@dataclass(frozen=True)
class Variant:
    """One backward kernel to compile: the flags its specialization depends on."""

    head_dim: int = 64
    dtype: str = "bf16"
    causal: bool = True
    deterministic: bool = True
    exact: bool = False
    audit: bool = False
    per_head: bool = True
    #: FlashAttention's ``window_size`` (with ``causal``: ``(left, 0)``); None: no window.
    #: The extents are runtime arguments, so any window compiles the same kernel.
    window: tuple[int, int] | None = None

    @property
    def mask(self):
        from dash_ref import Mask

        return Mask.of(self.causal, self.window or (-1, -1))

    def __str__(self) -> str:
        mode = "exact" if self.exact else "default"
        det = "deterministic" if self.deterministic else "atomic"
        mask = self.mask
        name = f"window {mask.left},{mask.right}" if mask.kind == "window" else mask.kind
        return f"d={self.head_dim} {self.dtype} {name} {det} {mode}"


def _compile(fn, pointers: dict[str, str], floats: tuple[str, ...], constants: dict,
             options: dict):
    """``fn`` compiled for sm_90; every argument not named is an ``i32``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = {n: ("constexpr" if n in constants else pointers.get(n) or
                     ("fp32" if n in floats else "i32")) for n in names}
    source = ASTSource(fn, signature,
                       constexprs={(names.index(n),): v for n, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def compile_backward(v: Variant):
    """The persistent backward kernel of variant ``v``, as a run would launch it."""
    from .bwd_kernel import dash_bwd_kernel
    from .config import backward_config

    cfg = backward_config(v.head_dim)
    pointers = {n: f"*{v.dtype}" for n in ("Q", "K", "V", "DO")}
    pointers |= {n: "*fp32" for n in ("LSE2", "DELTA", "DQ_ACC", "PARTIALS")}
    out = "*fp32" if v.per_head else f"*{v.dtype}"
    pointers |= {"DK": out, "DV": out}
    pointers |= {n: "*i32" for n in ("SEM", "WORKER_OFFSETS", "CHAIN_BHJ", "CHAIN_OFFSETS",
                                     "VISIT_Q", "VISIT_RANK")}
    constants = dict(BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=v.head_dim,
                     HEAD_DIM_V=v.head_dim, MASK=v.mask.kind,
                     DETERMINISTIC=v.deterministic, AUDIT=v.audit, PER_HEAD=v.per_head,
                     PREFETCH=cfg.prefetch, EXACT=v.exact, OPAQUE=True,
                     # a rectangular launch: the packed-batch arguments are absent
                     CU_SEQLENS_Q=None, CU_SEQLENS_K=None, Q_TILE_BASE=None,
                     VARLEN=False, SOFTCAP=None, SOFTCAP_K=None)  # no softcap
    if v.mask.kind != "window":  # a window's extents are i32 arguments; else absent
        constants |= dict(WINDOW_LEFT=None, WINDOW_RIGHT=None)
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                   enable_fp_fusion=not v.exact)
    return _compile(dash_bwd_kernel, pointers, ("scale_log2", "softmax_scale"), constants,
                    options)


def compile_delta(head_dim: int, pairwise: bool, dtype: str = "bf16"):
    """The ``D = rowsum(dO * O)`` preprocess kernel; ``pairwise``: its pairwise tree (the
    ``exact`` arithmetic and the CuTe default), built with fp fusion off as a launch does."""
    from dash_cuda.prepost import CLEAR_BLOCK, dash_delta_kernel

    from .config import backward_config

    # CLEAR: the backward's workspace, zeroed by the same launch
    pointers = {"O": f"*{dtype}", "DO": f"*{dtype}", "DELTA": "*fp32", "CLEAR": "*fp32"}
    constants = dict(BM=backward_config(head_dim).block_m, HEAD_DIM=head_dim, PAIRWISE=pairwise,
                     CLEAR_BLOCK=CLEAR_BLOCK)
    return _compile(dash_delta_kernel, pointers, (), constants,
                    dict(num_warps=4, enable_fp_fusion=not pairwise))


def sass_of(kernel) -> str:
    """The whole SASS listing of a compiled kernel (``cuobjdump -sass`` of its cubin).

    Triton's own ``asm["sass"]`` stops early on the larger backward kernels, so the listing
    is taken from the tool directly.
    """
    import subprocess
    import tempfile

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        return subprocess.run([knobs.nvidia.cuobjdump.path, "-sass", cubin.name],
                              check=True, capture_output=True, text=True).stdout


def describe(kernel) -> dict[str, Counter]:
    """Instruction counts of one compiled kernel: PTX, SASS and flushing SASS arithmetic."""
    ptx, sass = kernel.asm["ptx"], sass_of(kernel)
    return {"PTX": count(ptx, PTX_PATTERNS), "SASS": count(sass, SASS_PATTERNS),
            "SASS .FTZ arithmetic": Counter(re.findall(SASS_FTZ_ARITH, sass))}


VARIANTS = (
    Variant(64), Variant(64, exact=True), Variant(128), Variant(128, exact=True),
    Variant(64, causal=False, deterministic=False),
    Variant(64, window=(256, 0)), Variant(64, exact=True, window=(256, 0)),
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else None
    kernels = [(f"backward {v}", f"bwd_d{v.head_dim}_{'exact' if v.exact else 'default'}"
                f"{'' if v.deterministic else '_atomic'}{'_window' if v.window else ''}",
                compile_backward(v))
               for v in VARIANTS]
    kernels += [(f"preprocess D d={d} {'exact' if e else 'default'}",
                 f"delta_d{d}_{'exact' if e else 'default'}", compile_delta(d, e))
                for d in (64, 128) for e in (False, True)]
    for title, stem, kernel in kernels:
        print(f"== {title}: {kernel.metadata.num_warps} warps, {kernel.metadata.shared} B "
              f"shared")
        for part, found in describe(kernel).items():
            listing = ", ".join(f"{k} x{n}" for k, n in sorted(found.items())) or "none"
            print(f"  {part}: {listing}")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{stem}.ptx").write_text(kernel.asm["ptx"])
            (out / f"{stem}.sass").write_text(sass_of(kernel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
