"""Section 5: what a fingerprint promises, and real transcripts of ``dash-verify``.

Transcripts are produced by running the commands in this process through
:func:`verify.cli.main` and capturing what they print; a ``PYTHONPATH=tests`` prefix puts
the repository's ``tests/`` folder (home of the planted implementations) on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

import torch

from dash_ref import DETERMINISTIC, Problem, build_schedule
from dash_ref.emulate import emulate
from verify.compare import compare
from verify.demo import random_inputs

ROOT = Path(__file__).resolve().parents[1]
FP_PROBLEM = Problem(1, 2, 2, 64, 64, 16, "full", 16, 16)  # n_q = n_kv = 4
FP_WORKERS = (2, 3, 4, 132)
AUDIT_SHAPE = \
    "--mask full --seqlen-q 256 --heads 4 --head-dim 64 --dtype fp16 --trials 10"


def fingerprint_table(emulate_bits: bool = False) -> tuple[dict, str]:
    """Fingerprint of every deterministic schedule for several worker counts.

    With ``emulate_bits``, every (schedule, workers) is also emulated on one input set and
    its dQ, dK, dV compared bit for bit with the same schedule at the first worker count.
    """
    p = FP_PROBLEM
    numbers: dict = {}
    head = f"{'schedule':<17}" + "".join(f"{'W=' + str(w):<19}" for w in FP_WORKERS)
    lines = [f"full mask, S = {p.seqlen_q}, d = {p.head_dim}, BM = BN = {p.block_m} "
             f"(n_q = n_kv = {p.n_q}), {p.heads} heads: fingerprint per worker count W", head]
    inputs = random_inputs(p, torch.bfloat16, 0) if emulate_bits else None
    for name in DETERMINISTIC:
        row, fps, first = f"{name:<17}", [], None
        for w in FP_WORKERS:
            s = build_schedule(p, name, w)
            fp = s.fingerprint()
            fps.append(fp)
            row += f"{fp:<19}"
            numbers[f"fp.{name}.w{w}"] = fp
            if emulate_bits:
                bwd = emulate(s, *inputs)[1]
                if first is None:
                    first = bwd
                else:
                    same = all(compare(g, getattr(bwd, g), getattr(first, g)).equal
                               for g in ("dq_acc", "dk_acc", "dv_acc"))
                    numbers[f"fp.{name}.w{w}.same_bits"] = "yes" if same else "no"
                    numbers[f"fp.{name}.w{w}.same_fp"] = "yes" if fp == fps[0] else "no"
        numbers[f"fp.{name}.distinct"] = len(set(fps))
        lines.append(row)
    if emulate_bits:
        pairs = [(k.rsplit(".", 1)[0], v) for k, v in numbers.items() if k.endswith("same_fp")]
        agree = sum(numbers[f"{k}.same_bits"] == v for k, v in pairs)
        numbers["fp.checked"] = len(pairs)
        numbers["fp.agree"] = agree
    return numbers, "\n".join(lines)


def run_command(command: str) -> tuple[int, str]:
    """Run a ``dash-verify`` command line in this process; ``(exit status, stdout)``."""
    from verify.cli import main

    words = shlex.split(command)
    extra = []
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        if key != "PYTHONPATH":
            raise ValueError(f"unsupported environment setting {key}")
        extra += [str(ROOT / part) for part in value.split(os.pathsep)]
    assert words.pop(0) == "dash-verify"
    added = [p for p in extra if p not in sys.path]
    sys.path[:0] = added
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), open(os.devnull, "w") as null, \
                contextlib.redirect_stderr(null):
            status = main(words)
    finally:
        for p in added:
            sys.path.remove(p)
    return status, out.getvalue()


def transcript(command: str) -> tuple[int, str]:
    status, text = run_command(command)
    return status, f"$ {command}\n{text.rstrip()}" + (f"\n(exit status {status})" if status
                                                        else "")


def transcripts() -> tuple[dict, dict]:
    """Audits of ``emulator:atomic`` and ``emulator:shift``, a fuzz of a planted bug, the
    reproducer it prints, the same case on a correct implementation, and an audit with a
    softcap and sinks of a planted order-dependent ``dsink``."""
    numbers, out = {}, {}
    for impl in ("atomic", "shift"):
        _, out[f"audit_{impl}"] = transcript(
            f"dash-verify audit --impl emulator:{impl} {AUDIT_SHAPE}")
    status, out["fuzz_planted"] = transcript(
        "PYTHONPATH=tests dash-verify fuzz --impl planted:broken_tail --budget 200 "
        "--max-elements 20000")
    numbers["fuzz.status"] = status
    repro = re.search(r"^reproduce: (dash-verify check .*)$", out["fuzz_planted"], re.M)
    if repro:
        _, out["check_planted"] = transcript("PYTHONPATH=tests " + repro.group(1))
        correct = repro.group(1).replace("planted:broken_tail", "emulator:naive")
        _, out["check_emulator"] = transcript(correct)
        case = re.search(r"--seqlen-q (\d+) --seqlen-k (\d+)", repro.group(1))
        numbers["fuzz.seqlen_q"], numbers["fuzz.seqlen_k"] = map(int, case.groups())
    _, out["audit_sinks"] = transcript(
        "PYTHONPATH=tests dash-verify audit --impl planted:shuffled_dsink --seqlen-q 64 "
        "--heads 2 --head-dim 16 --softcap 30 --learnable-sink=0.5,-2 --trials 6 "
        "--no-perturb")
    _, out["audit_sinks"] = transcript(
        "dash-verify audit --impl emulator:shift --seqlen-q 64 --heads 2 --head-dim 16 "
        "--softcap 30 --learnable-sink=0.5,-2 --trials 4")
    _, out["check_sinks"] = transcript(
        "PYTHONPATH=tests dash-verify check --impl planted:zero_dsink --seqlen-q 64 "
        "--heads 2 --head-dim 16 --softcap 30 --learnable-sink=0.5,-2")
    _, out["schedule_shift"] = transcript(
        "dash-verify schedule --name shift --mask full --seqlen-q 512 --block-m 128 "
        "--block-n 128 --heads 2 --head-dim 64 --workers 4")
    return numbers, out
