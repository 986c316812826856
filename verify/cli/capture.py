"""``dash-verify capture``: one default CuTe run on the GPU, kept in one file as a proof."""

from __future__ import annotations

import argparse
from typing import TextIO

from dash_ref import BANDED, RAGGED
from dash_ref.schedules.problem import MASKS

from .args import (
    EXIT_OK,
    SCHEDULES,
    Outcome,
    add_feature_args,
    lengths,
    nonnegative_int,
    output_file,
    positive_int,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "capture", help="run dash_cuda once on the GPU and keep everything L2 needs in FILE",
        description="Run dash_cuda's forward and audited backward once on the GPU with fresh "
                    "random inputs and write one file: the inputs, O, LSE2, the gradients, "
                    "the audit record, the schedule, the arithmetic and the environment. "
                    "`dash-verify reproduce FILE` checks it bit for bit on any CPU. Small "
                    "problems only (every dQ partial is kept).")
    p.add_argument("--out", type=output_file, required=True, metavar="FILE",
                   help="the capture file to write")
    g = p.add_argument_group("problem")
    g.add_argument("--mask", choices=MASKS, default="causal", help="attention mask")
    g.add_argument("--seqlen-q", type=positive_int, default=200, metavar="N", help="S_q")
    g.add_argument("--seqlen-k", type=positive_int, default=None, metavar="N",
                   help="S_k (default: --seqlen-q)")
    g.add_argument("--batch", type=positive_int, default=1, metavar="B", help="batch size")
    g.add_argument("--heads", type=positive_int, default=2, metavar="H", help="query heads")
    g.add_argument("--heads-kv", type=positive_int, default=None, metavar="H_KV",
                   help="key/value heads, a divisor of H (default: --heads)")
    g.add_argument("--head-dim", type=positive_int, default=64, metavar="D", help="head dim")
    g.add_argument("--head-dim-v", type=positive_int, default=None, metavar="D_V",
                   help="the values' head dim (default: --head-dim)")
    g.add_argument("--seqlens-q", type=lengths, default=None, metavar="L,L,...",
                   help="a packed batch: each sequence's query length, in place of --batch "
                        "and --seqlen-q")
    g.add_argument("--seqlens-k", type=lengths, default=None, metavar="L,L,...",
                   help="each sequence's key length (default: --seqlens-q)")
    g.add_argument("--window-size", type=int, nargs=2, default=(-1, -1),
                   metavar=("LEFT", "RIGHT"),
                   help="FlashAttention's sliding window (-1: unbounded on that side)")
    g.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16", help="input dtype")
    g.add_argument("--seed", type=nonnegative_int, default=0, help="input seed")
    g.add_argument("--schedule", default="auto", help="deterministic schedule",
                   choices=[s for s in (*SCHEDULES, *RAGGED, *BANDED) if s != "atomic"])
    g.add_argument("--workers", type=positive_int, default=None, metavar="W",
                   help="persistent workers (default: the GPU's SMs)")
    g.add_argument("--backend", choices=["cute", "triton"], default="cute",
                   help="kernel backend (triton: only with --exact, the one arithmetic of "
                        "its backward the CPU reproduces)")
    g.add_argument("--exact", action="store_true",
                   help="the backward in exact=True arithmetic (Triton backend)")
    add_feature_args(p)
    return p


def inputs_from_args(args: argparse.Namespace, device: str = "cuda") -> tuple:
    """``(q, k, v, do, learnable_sink, packing)`` of the flags: seeded standard-normal
    inputs on ``device`` (``(B, S, H, d)``, or ``(total, H, d)`` with ``--seqlens-q``, whose
    varlen keywords ``packing`` then holds), the sinks fp32 (None without)."""
    import torch

    from verify.cli.args import problem_from_args
    from verify.impls import packing_of

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    heads_kv = args.heads if args.heads_kv is None else args.heads_kv
    if args.heads % heads_kv:
        raise ValueError(f"--heads-kv {heads_kv} must divide --heads {args.heads}")
    d_v = args.head_dim if args.head_dim_v is None else args.head_dim_v
    if args.learnable_sink is not None and len(args.learnable_sink) != args.heads:
        raise ValueError(f"--learnable-sink has {len(args.learnable_sink)} logits, --heads "
                         f"{args.heads}: one per query head")
    packing = None
    s_k = args.seqlen_q if args.seqlen_k is None else args.seqlen_k
    rows_q, rows_k = (args.batch, args.seqlen_q), (args.batch, s_k)
    if args.seqlens_q is not None or args.seqlens_k is not None:
        p = problem_from_args(argparse.Namespace(
            **{**vars(args), "block_m": None, "block_n": None, "heads_kv": heads_kv}))
        packing = packing_of(p, device)
        rows_q, rows_k = (p.total_q,), (p.total_k,)
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def draw(rows, h, d):
        return torch.randn(*rows, h, d, device=device, generator=gen).to(dtype)

    q, do = draw(rows_q, args.heads, args.head_dim), draw(rows_q, args.heads, d_v)
    k, v = draw(rows_k, heads_kv, args.head_dim), draw(rows_k, heads_kv, d_v)
    sink = None if args.learnable_sink is None else torch.tensor(
        args.learnable_sink, dtype=torch.float32, device=device)
    return q, k, v, do, sink, packing


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    import torch

    from verify.capture import capture, save
    from verify.impls import Unavailable

    if not torch.cuda.is_available():
        raise Unavailable("capture runs dash_cuda on a CUDA GPU; none is visible here")
    if args.backend == "triton" and not args.exact:
        raise ValueError("the triton backend's default arithmetic has no CPU counterpart: "
                         "capture it with --exact, or capture the cute backend")
    q, k, v, do, sink, packing = inputs_from_args(args)
    c = capture(q, k, v, do, causal=args.mask == "causal", schedule=args.schedule,
                num_workers=args.workers, backend=args.backend, exact=args.exact,
                window_size=tuple(args.window_size), softcap=args.softcap,
                learnable_sink=sink, packing=packing)
    save(c, args.out)
    print(f"captured {c.describe()} into {args.out}", file=out)
    return Outcome(EXIT_OK, f"captured into {args.out}",
                   {"file": str(args.out), "run": c.describe(),
                    "environment": c.meta["environment"]})
