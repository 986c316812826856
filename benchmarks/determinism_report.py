"""Which attention backwards on this GPU are bitwise repeatable? One command, one report.

Runs :func:`verify.audit.audit` (forward + backward on identical inputs, with a busy second
stream, fresh allocations and unrelated work between runs) for every implementation that
is importable here, on the paper's grid at S = 1k and 8k, and a long audit (1000 trials by
default) of every dash_cuda schedule and of its atomic peer on one shape per mask and head
dim (``--long-head-dims``; hidden 2048, S = 4096; the causal
forward hands its tiles out from a counter: the order CTAs take tiles in varies from run to
run, the bits must not). ``--long-packed heavy:16384,...`` adds the long audit of packed
batches (the mixes of ``model_varlen.lengths``, d = 128, 16 heads, causal): every packed
schedule of the ``--backends``, the atomic peer and FlashAttention-4's varlen kernels with
and without ``deterministic=True``. Writes
``determinism.json`` and ``determinism.md`` to ``--out``.

    PYTHONPATH=. python benchmarks/determinism_report.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
from harness import HEAD_DIMS, HIDDEN, TOKENS, git_revision, no_cuda
from model_varlen import HEAD_DIM as VARLEN_HEAD_DIM
from model_varlen import HEADS as VARLEN_HEADS
from model_varlen import lengths as varlen_lengths

from dash_ref import DETERMINISTIC, MASKS, Problem
from verify.audit import audit
from verify.impls import get_impl, load_fa4

PEERS = ("sdpa-cudnn", "sdpa-cudnn-det", "sdpa-flash", "sdpa-flash-det", "sdpa-efficient",
         "sdpa-efficient-det", "fa4", "fa4-det")


def grid(seqlens: list[int]) -> list[Problem]:
    """The paper's grid (16384 tokens, hidden 2048) at the given lengths, both masks."""
    out = []
    for d in HEAD_DIMS:
        for s in seqlens:
            for mask in ("full", "causal"):
                out.append(Problem(TOKENS // s, HIDDEN // d, HIDDEN // d, s, s, d, mask))
    return out


def available(names: list[str]) -> list[str]:
    ok = []
    for name in names:
        if name.startswith("fa4") and load_fa4() is None:
            print(f"  skip {name}: FlashAttention-4 is not importable", flush=True)
            continue
        ok.append(name)
    return ok


def run_audit(name: str, p: Problem, trials: int) -> dict:
    label = (f"{name:<22} d={p.head_dim:<4} S={p.seqlen_q:<6} {p.mask:<7} "
             f"{trials} trials")
    try:
        rep = audit(get_impl(name), p, trials=trials, perturb=True, progress=False)
    except Exception as exc:  # an unsupported shape or backend is a finding, not a crash
        print(f"  {label}: ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
              flush=True)
        return {"impl": name, "problem": p.__dict__, "trials": trials, "error": str(exc)[:500]}
    if rep.failure:  # crashed, timed out or broke the interface contract on a trial
        print(f"  {label}: ERROR {rep.failure[:120]}", flush=True)
        return {"impl": name, "problem": p.__dict__, "trials": trials,
                "error": rep.failure[:500]}
    distinct = {k: v.distinct for k, v in rep.outputs.items()}
    print(f"  {label}: {'repeatable' if rep.deterministic else 'NOT repeatable'} "
          f"distinct={distinct} median {rep.median_ms:.2f} ms", flush=True)
    out = rep.to_json()
    out["impl"] = name
    return out


def packed_problem(mix: str, total: int) -> Problem:
    """A packed batch of ``total`` tokens in ``model_varlen``'s ``mix``, its d, heads,
    causal (the cells of ``bench_features.py``)."""
    seqlens = varlen_lengths(mix, total)
    return Problem.packed(seqlens, seqlens, VARLEN_HEADS, VARLEN_HEADS, VARLEN_HEAD_DIM,
                          "causal")


def _length(p: dict) -> str:
    """A row's length: ``S``, or a packed batch's tokens and sequences."""
    if p.get("seqlens_q"):
        return f"{sum(p['seqlens_q'])} packed ({len(p['seqlens_q'])} seqs)"
    return str(p["seqlen_q"])


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Determinism audit on {meta['gpu']}", "",
             f"Command: `{meta['command']}`  ", f"git {meta['git']}, torch {meta['torch']}, "
             f"triton {meta['triton']}, {meta['date']}", "",
             "Each row: forward + backward on identical inputs, perturbed between runs (busy "
             "second stream, fresh allocations, unrelated work). `distinct` counts bit "
             "patterns of O / dQ / dK / dV.", "",
             "| impl | d | S | mask | trials | repeatable | distinct O/dQ/dK/dV | max ulp dQ |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["problem"]
        if "error" in r:
            lines.append(f"| {r['impl']} | {p['head_dim']} | {_length(p)} | {p['mask']} | "
                         f"{r['trials']} | error | {r['error'][:60]} | |")
            continue
        o = r["outputs"]
        dist = "/".join(str(o[k]["distinct"]) for k in ("O", "dQ", "dK", "dV"))
        lines.append(f"| {r['impl']} | {p['head_dim']} | {_length(p)} | {p['mask']} | "
                     f"{r['trials']} | {'yes' if r['deterministic'] else '**no**'} | {dist} | "
                     f"{o['dQ']['max_ulp_spread']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--seqlens", default="1024,8192")
    ap.add_argument("--trials", type=int, default=20, help="per peer and grid cell")
    ap.add_argument("--long-trials", type=int, default=1000, help="per dash_cuda schedule")
    ap.add_argument("--backends", default="triton",
                    help="comma-separated dash_cuda backends of the long audit")
    ap.add_argument("--long-masks", default="full,causal",
                    help="comma-separated masks of the long audit (one shape each; "
                         "empty: none)")
    ap.add_argument("--long-head-dims", default="64",
                    help="comma-separated head dims of the long audit (hidden 2048: "
                         "2048 // d heads; S 4096)")
    ap.add_argument("--long-packed", default="",
                    help="comma-separated MIX:TOTAL packed batches of the long audit "
                         "(MIX: equal, uniform, heavy), e.g. heavy:16384,uniform:65536")
    ap.add_argument("--packed-schedules", default="auto,lpt,naive,atomic",
                    help="the schedules of ours audited on each --long-packed cell")
    ap.add_argument("--packed-peers", default="fa4-det,fa4",
                    help="the peers audited on each --long-packed cell (those installed)")
    ap.add_argument("--no-grid", dest="grid", action="store_false",
                    help="only the long audit of the dash_cuda schedules")
    ap.add_argument("--tag", default="determinism", help="file stem of the report")
    args = ap.parse_args(argv)
    masks = [m for m in args.long_masks.split(",") if m]  # "": no rectangular long audit
    if not set(masks) <= set(MASKS):
        print(f"--long-masks: unknown mask in {args.long_masks!r} ({', '.join(MASKS)})",
              file=sys.stderr)
        return 2
    try:
        head_dims = [int(d) for d in args.long_head_dims.split(",")]
    except ValueError:
        head_dims = []
    if not head_dims or any(not 0 < d <= HIDDEN for d in head_dims):
        print(f"--long-head-dims: expected head dims in 1..{HIDDEN}, got "
              f"{args.long_head_dims!r}", file=sys.stderr)
        return 2
    try:
        packed = [packed_problem(mix, int(total)) for mix, total in
                  (cell.split(":") for cell in args.long_packed.split(",") if cell)]
    except ValueError as exc:
        print(f"--long-packed: expected MIX:TOTAL cells, got {args.long_packed!r} ({exc})",
              file=sys.stderr)
        return 2
    if no_cuda("determinism_report"):
        return 2
    t0 = time.time()
    meta = {
        "command": "python " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "git": git_revision(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut short keeps what it measured
        (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows},
                                                         indent=1))
        (out / f"{args.tag}.md").write_text(markdown(rows, meta))

    ours = [f"dash-{be}:{n}" for be in args.backends.split(",")
            for n in (*DETERMINISTIC, "atomic")]
    print(f"long audit, {args.long_trials} trials each:", flush=True)
    for d in head_dims:
        for mask in masks:
            long_problem = Problem(TOKENS // 4096, HIDDEN // d, HIDDEN // d, 4096, 4096, d, mask)
            for name in ours:
                rows.append(run_audit(name, long_problem, args.long_trials))
                save()
    packed_impls = [f"dash-{be}:{n}" for be in args.backends.split(",")
                    for n in args.packed_schedules.split(",") if n] + available(
                        [n for n in args.packed_peers.split(",") if n])
    for p in packed:
        for name in packed_impls:
            rows.append(run_audit(name, p, args.long_trials))
            save()
    peers = available(list(PEERS)) if args.grid else []
    if args.grid:
        print(f"grid audit, {args.trials} trials each:", flush=True)
    for p in grid([int(s) for s in args.seqlens.split(",")]) if args.grid else []:
        for name in ["dash:auto", "dash:atomic", *peers]:
            rows.append(run_audit(name, p, args.trials))
            save()
    save()
    print(f"wrote {out}/{args.tag}.json and .md in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
