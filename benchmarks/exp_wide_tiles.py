"""Experiment: the Triton tiles at head dims 192 / 128 and 256 (one table row, width 256).

Each configuration runs in a fresh process (the tile tables are constants, read once), which
patches the row, checks ``O`` and the gradients against the float64 reference, and times the
forward and the backward (``dash_cuda.attention_forward`` / ``attention_backward`` on fixed
inputs, CUDA events, median of ``--reps`` back-to-back calls after a warm-up)::

    python benchmarks/exp_wide_tiles.py --out OUT

Writes ``OUT/wide_tiles.json`` and prints one line per configuration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CELLS = [(192, 128, True, 4096, 4, 16), (256, 256, True, 4096, 2, 8)]
FORWARD = [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3)]
BACKWARD = [(64, 64, 8, 1), (64, 64, 4, 1), (32, 64, 4, 1), (64, 32, 4, 1), (32, 128, 8, 1),
            (64, 64, 8, 2)]

CHILD = r"""
import json, statistics, sys, torch
from dash_cuda.backends.triton import config
part, cfg, cell, reps = json.loads(sys.argv[1])
table = config._FORWARD if part == "forward" else config._BACKWARD
table[256] = config.TileConfig(*cfg)
import dash_cuda
from verify.reference import attention_f64, grad_checks
d, dv, causal, s, b, h = cell
gen = torch.Generator(device="cuda").manual_seed(0)
q, k = (torch.randn(b, s, h, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
v, do = (torch.randn(b, s, h, dv, device="cuda", generator=gen).bfloat16() for _ in range(2))
kw = dict(causal=causal, backend="triton")
o, lse = dash_cuda.attention_forward(q, k, v, **kw)
grads = dash_cuda.attention_backward(q, k, v, o, lse, do, **kw)[:3]
small = [torch.randn(1, n, 2, e, device="cuda", generator=gen).bfloat16()
         for n, e in ((300, d), (333, d), (333, dv), (300, dv))]  # the same tiles, checked
o1, l1 = dash_cuda.attention_forward(*small[:3], **kw)
g1 = dash_cuda.attention_backward(*small[:3], o1, l1, small[3], **kw)[:3]
ref = attention_f64(*small, causal=causal)
ok = all(c.ok for c in grad_checks(dict(zip(("o", "dq", "dk", "dv"), (o1, *g1))), ref,
                                   torch.bfloat16).values())
def timed(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); z.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(z))
    return statistics.median(times)
fn = (lambda: dash_cuda.attention_forward(q, k, v, **kw)) if part == "forward" else (
    lambda: dash_cuda.attention_backward(q, k, v, o, lse, do, **kw))
print(json.dumps({"ms": timed(fn), "float64_ok": ok}))
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for cell in CELLS:
        for part, configs in (("backward", BACKWARD), ("forward", FORWARD)):
            for cfg in configs:
                job = json.dumps([part, cfg, cell, args.reps])
                done = subprocess.run([sys.executable, "-c", CHILD, job], capture_output=True,
                                      text=True, timeout=300)
                row = {"cell": cell, "part": part, "config": cfg}
                if done.returncode == 0:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                else:
                    row["error"] = done.stderr.strip().splitlines()[-1][:300]
                results.append(row)
                print(row, flush=True)
    (args.out / "wide_tiles.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
