#!/usr/bin/env python3
"""Capture exact-mode backward runs on the GPU, compare them with the emulator on any CPU.

``tests/gpu/test_cuda_exact.py`` says *whether* the CPU emulation reproduces the kernel;
when it does not, this says *where*: the first step (``D``, a partial, an accumulator,
a rounded gradient) whose bits differ, and how many elements differ there. Capturing
needs the GPU; comparing does not::

    PYTHONPATH=. python3 scripts/capture_exact.py capture OUT   # on the GPU machine
    PYTHONPATH=. python3 scripts/capture_exact.py compare OUT   # anywhere
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

# (B, H, H_kv, S_q, S_k), d, dtype, causal, schedule, num_workers
CASES = [
    ((1, 2, 1, 250, 300), 64, torch.bfloat16, False, "shift", None),
    ((1, 1, 1, 256, 256), 128, torch.float16, True, "symmetric_shift", 3),
]


def capture(out: Path) -> None:
    import dash_cuda

    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(81)
    for n, (shape, d, dtype, causal, schedule, workers) in enumerate(CASES):
        b, h, hk, sq, sk = shape
        q, do = (torch.randn(b, sq, h, d, device="cuda", generator=gen).to(dtype)
                 for _ in range(2))
        k, v = (torch.randn(b, sk, hk, d, device="cuda", generator=gen).to(dtype)
                for _ in range(2))
        o, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
        dq, dk, dv, rec = dash_cuda.attention_backward(
            q, k, v, o, lse, do, causal=causal, schedule=schedule, num_workers=workers,
            audit=True, exact=True)
        tensors = dict(q=q, k=k, v=v, o=o, lse=lse, do=do, dq=dq, dk=dk, dv=dv,
                       partials=rec.partials, dq_acc=rec.dq_acc, dk_heads=rec.dk_heads,
                       dv_heads=rec.dv_heads, delta=rec.delta)
        torch.save(dict({k_: t.cpu() for k_, t in tensors.items()}, causal=causal,
                        schedule=schedule, num_workers=rec.schedule.num_workers,
                        flush_subnormals=rec.flush_subnormals),
                   out / f"exact_case{n}.pt")
        print(f"case {n}: captured {shape} d={d} {dtype} causal={causal} {schedule}")


def _differ(name: str, got: torch.Tensor, want: torch.Tensor) -> bool:
    if torch.equal(got, want):
        print(f"  {name:<10} equal ({got.numel()} elements)")
        return False
    bad = (got != want) & ~(got.isnan() & want.isnan())
    print(f"  {name:<10} DIFFER in {int(bad.sum())} of {got.numel()} elements; first at "
          f"{tuple(int(i) for i in bad.nonzero()[0])}: {got[bad][0].item()!r} vs "
          f"{want[bad][0].item()!r}")
    return True


def compare(out: Path) -> int:
    from dash_cuda import backward_problem
    from dash_ref import build_schedule
    from verify.l2 import KERNEL_VALUES, l2_steps

    failures = 0
    for path in sorted(out.glob("exact_case*.pt")):
        c = torch.load(path)
        q, k, v, o, lse, do = (c[n] for n in ("q", "k", "v", "o", "lse", "do"))
        b, sq, h, d = q.shape
        problem = backward_problem(b, h, k.shape[2], sq, k.shape[1], d, c["causal"])
        sched = build_schedule(problem, c["schedule"], c["num_workers"])
        print(f"{path.name}: {tuple(q.shape)} {q.dtype} causal={c['causal']} {c['schedule']}")
        steps = l2_steps(sched, (q, k, v, o, lse, do), {n: c[n] for n in KERNEL_VALUES},
                         flush_subnormals=c.get("flush_subnormals", True))
        failures += sum(_differ(name, got, want) for name, got, want in steps)
    print("all equal" if not failures else f"{failures} steps differ")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["capture", "compare"])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.action == "capture":
        capture(args.out)
        return 0
    return compare(args.out)


if __name__ == "__main__":
    raise SystemExit(main())
