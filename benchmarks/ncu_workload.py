"""The workload that ``scripts/gpu_release.sh profile`` runs under Nsight Compute.

Each case (head dim, mask, sequence length on the paper's grid) runs every implementation's
forward and backward once for warm-up (compiles), then once more inside a profiler range
(``cudaProfilerStart``/``Stop``; ncu runs with ``--profile-from-start off``). Every range
opens with ``torch.cuda._sleep`` (a kernel named ``spin_kernel``), so that the report's
kernels split into ranges in order; ``ranges.json`` in ``--out`` names them::

    ncu --profile-from-start off ... python benchmarks/ncu_workload.py --out OUT
    python benchmarks/ncu_summary.py OUT      # the table, from ncu's CSV exports

Implementations: ``cute:SCHEDULE`` / ``cute:atomic`` (this package), ``fa4`` and ``fa4-det``
(FlashAttention-4 with and without ``deterministic=True``), on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness import HIDDEN, TOKENS, grid_inputs, load_fa4, no_cuda, parse_cell, peer_closures

IMPLS = ("cute:shift", "cute:atomic", "fa4-det", "fa4")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", type=parse_cell,
                        default=[(64, "full", 4096), (128, "full", 2048)],
                        help="d:mask:S on the paper's grid (16384 tokens, hidden 2048)")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS))
    args = parser.parse_args(argv)
    if no_cuda("ncu_workload"):
        return 2
    import torch

    fa = load_fa4()
    impls = [i for i in args.impls if fa is not None or not i.startswith("fa4")]
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ranges = []
    for d, mask, s in args.cases:
        h, b, causal = HIDDEN // d, TOKENS // s, mask == "causal"
        q, k, v, do = grid_inputs(d, s, gen)
        for impl in impls:
            fwd, bwd = peer_closures(impl, q, k, v, do, causal, None, fa)
            for name, fn in (("fwd", fwd), ("bwd", bwd)):
                if name == "fwd" and impl in ("cute:atomic", "fa4-det"):
                    continue  # the same forward as cute:shift / fa4
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                torch.cuda._sleep(1000)  # the range's marker kernel
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                ranges.append({"d": d, "mask": mask, "S": s, "B": b, "H": h, "impl": impl,
                               "pass": name})
                print(f"profiled {impl} {name} d={d} {mask} S={s}", flush=True)
    (args.out / "ranges.json").write_text(json.dumps(ranges, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
