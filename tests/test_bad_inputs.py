"""Bad inputs get a clear error, never a traceback or a silently wrong answer.

The command line: every subcommand exits 0 when the claim holds, 1 on a finding and 2 on
bad usage or an environment that cannot run the check, with one line on stderr naming the
argument, the value and the rule. The Python API: the exception type and the words that
say what is wrong, raised before any work starts.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from dash_cuda.checks import check_options
from dash_ref import Problem, build_dag, build_schedule, resolve_name, simulate
from dash_ref.arithmetic import steps
from dash_ref.emulate import emulate, replay
from verify.cli import main
from verify.demo import random_inputs

NO_CUDA = not torch.cuda.is_available()
SHAPE = ["--seqlen-q", "24", "--heads", "1", "--head-dim", "16"]
TINY = [*SHAPE, "--block-m", "16", "--block-n", "16"]  # tiles: for emulator:NAME only

# (argv, exit code, words the one-line message must contain)
CLI_CASES = [
    # the list
    (["check", "--impl", "bogus"], 2, ["unknown implementation 'bogus'"]),
    (["check", "--impl", "nomodule:fn"], 2, ["cannot import module 'nomodule'"]),
    (["demo", "--head-dim", "0"], 2, ["--head-dim", "must be >= 2", "got 0"]),
    (["demo", "--block", "0"], 2, ["--block", ">= 1", "got 0"]),
    (["demo", "--workers", "0"], 2, ["--workers", ">= 1"]),
    (["demo", "--seqlen", "0"], 2, ["--seqlen", ">= 1"]),
    (["audit", "--impl", "emulator:naive", "--head-dim", "0"], 2, ["--head-dim", ">= 1"]),
    (["audit", "--impl", "emulator:naive", "--trials", "0"], 2, ["--trials", ">= 2"]),
    (["fuzz", "--impl", "emulator:naive", "--budget", "0"], 2, ["--budget", ">= 1"]),
    (["simulate", "--gantt", "/nonexistent/x.png"], 2, ["--gantt", "does not exist"]),
    (["simulate", "--cost-compute", "-1"], 2, ["--cost-compute", "finite and >= 0"]),
    (["simulate", "--cost-reduce", "nan"], 2, ["--cost-reduce", "finite", "nan"]),
    (["check", "--impl", "emulator:naive", "--schedule", "bogus"], 2,
     ["--schedule", "invalid choice", "bogus"]),
    (["fuzz", "--impl", "emulator:naive", "--max-elements", "0"], 2,
     ["--max-elements", ">= 512", "got 0"]),
    (["fuzz", "--impl", "emulator:naive", "--max-elements", "-5"], 2, ["--max-elements"]),
    # more of the same kind
    (["check", "--impl", "verify.impls:no_such_function"], 2, ["no callable"]),
    (["check", "--impl", "emulator:bogus"], 2, ["unknown schedule 'bogus'"]),
    (["check", "--impl", "sdpa-bogus"], 2, ["unknown SDPA implementation"]),
    (["check", "--impl", "dash-exact:atomic"], 2, ["deterministic schedule"]),
    (["check", "--impl", "emulator:naive", "--dtype", "fp32"], 2, ["--dtype", "fp32"]),
    (["demo", "--seqlen", "abc"], 2, ["--seqlen", "expected an integer", "'abc'"]),
    (["demo", "--head-dim", "1"], 2, ["--head-dim", ">= 2"]),
    (["audit", "--impl", "emulator:naive", "--trials", "1"], 2, ["--trials", ">= 2"]),
    (["audit", *TINY], 2, ["--impl", "required"]),
    (["audit", "--impl", "emulator:naive", *TINY, "--json", "/nonexistent/a.json"], 2,
     ["/nonexistent/a.json"]),
    (["schedule", "--heads", "3", "--heads-kv", "2"], 2, ["multiple of Problem.heads_kv"]),
    (["schedule", "--name", "bogus"], 2, ["--name", "invalid choice"]),
    (["schedule", "--mask", "diagonal"], 2, ["--mask", "invalid choice"]),
    (["schedule", "--workers", "0"], 2, ["--workers", ">= 1"]),
    (["schedule", "--seqlen-q", "-3"], 2, ["--seqlen-q", ">= 1"]),
    (["simulate", "--cost-reduce", "inf"], 2, ["--cost-reduce", "finite"]),
    (["simulate", "--model", "fast"], 2, ["--model", "invalid choice"]),
    (["simulate", "--width", "5"], 2, ["--width", ">= 20"]),
    (["bogus"], 2, ["invalid choice"]),
    ([], 2, ["required"]),
    # exit 0 and 1: the claim holds, or a finding
    (["check", "--impl", "emulator:auto", *TINY], 0, []),
    (["schedule", "--name", "auto", *TINY], 0, []),
    (["audit", "--impl", "emulator:naive", *TINY, "--trials", "3"], 0, []),
    (["audit", "--impl", "emulator:atomic", "--mask", "full", "--seqlen-q", "256",
      "--heads", "4", "--head-dim", "64", "--dtype", "fp16", "--trials", "3",
      "--block-m", "16", "--block-n", "16"], 1, []),
    (["audit", "--impl", "planted:shuffled_dq", "--seqlen-q", "256", "--heads", "4",
      "--head-dim", "64", "--dtype", "fp16", "--trials", "3"], 1, []),
    (["audit", "--impl", "planted:reference_cast", *SHAPE, "--trials", "3"], 0, []),
    (["check", "--impl", "planted:broken_tail", "--seqlen-q", "17", "--head-dim", "16"], 1,
     []),
]
# an implementation that cannot run here is an environment error (2), not a finding (1)
CUDA_CASES = [
    (["fuzz", "--impl", "dash:shift", "--budget", "2"], 2, ["needs a CUDA device"]),
    (["check", "--impl", "dash:shift", *SHAPE], 2, ["needs a CUDA device"]),
    (["audit", "--impl", "dash:shift", *SHAPE, "--trials", "2"], 2, ["needs a CUDA device"]),
    (["audit", "--impl", "sdpa-cudnn", *SHAPE, "--trials", "2"], 2, ["needs a CUDA device"]),
]


def _check_run(capsys, argv, code, words):
    got = main(argv)
    out, err = capsys.readouterr()
    assert got == code, (argv, out, err)
    assert "Traceback" not in out + err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("dash-verify")
        for word in words:
            assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("argv, code, words", CLI_CASES, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_cli_exit_codes_and_one_line_errors(argv, code, words, capsys):
    _check_run(capsys, argv, code, words)


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")
@pytest.mark.parametrize("argv, code, words", CUDA_CASES, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_cli_needs_cuda_is_exit_2(argv, code, words, capsys):
    _check_run(capsys, argv, code, words)


def test_debug_shows_the_traceback(capsys):
    assert main(["check", "--impl", "nomodule:fn", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_the_installed_command_prints_one_line_and_exits_2():
    done = subprocess.run([sys.executable, "-m", "verify.cli", "demo", "--seqlen", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "--seqlen" in done.stderr
    version = subprocess.run([sys.executable, "-m", "verify.cli", "--version"],
                             capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("dash-verify 0.")


def test_help_shows_defaults_and_exit_codes(capsys):
    assert main(["audit", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 100)" in text and "(default: bf16)" in text
    assert "exit status: 0" in text and "2 bad usage" in text


# -- the Python API --------------------------------------------------------------------------
P = Problem(1, 2, 1, 32, 32, 16, "full", 16, 16)
S = build_schedule(P, "naive", 2)
Q, K, V, DO = random_inputs(P, torch.bfloat16, seed=0)


def _api_cases():
    from verify.audit import audit
    from verify.fuzz import check, fuzz
    from verify.impls import get_impl
    from verify.reference import attention_f64
    from verify.strategies import Case

    case = Case(P)
    return [
        (lambda: Problem(1, 1, 1, "256", 256, 16), TypeError, "Problem.seqlen_q must be an int"),
        (lambda: Problem(1, 1, 1, 256.5, 256, 16), TypeError, "Problem.seqlen_q must be an int"),
        (lambda: Problem(True, 1, 1, 256, 256, 16), TypeError, "Problem.batch must be an int"),
        (lambda: Problem(0, 1, 1, 256, 256, 16), ValueError, "Problem.batch must be >= 1"),
        (lambda: Problem(1, 1, 1, -1, 256, 16), ValueError, "Problem.seqlen_q must be >= 0"),
        (lambda: Problem(1, 3, 2, 256, 256, 16), ValueError, "multiple of Problem.heads_kv"),
        (lambda: Problem(1, 1, 1, 64, 64, 16, "diag"), ValueError, "Problem.mask"),
        (lambda: build_schedule(P, "shift", 4.5), TypeError, "num_workers must be an int"),
        (lambda: build_schedule(P, "shift", 0), ValueError, "num_workers must be >= 1"),
        (lambda: build_schedule(P, "bogus", 2), ValueError, "unknown schedule 'bogus'"),
        (lambda: build_schedule("P", "shift", 2), TypeError, "problem must be a Problem"),
        (lambda: resolve_name("shift", P, portable=True), ValueError, "orders its sums by"),
        (lambda: resolve_name("auto", P, portable=1), TypeError, "portable must be a bool"),
        (lambda: check_options(False, None, "symmetric_shift", True, None, portable=True),
         ValueError, "portable=True takes"),
        (lambda: check_options(False, None, "auto", False, None, portable=True), ValueError,
         "atomic peer"),
        (lambda: check_options(False, None, "auto", True, None, portable="yes"), TypeError,
         "portable must be a bool"),
        (lambda: simulate(S, cost_compute=-1.0), ValueError, "cost_compute must be >= 0"),
        (lambda: simulate(S, cost_reduce=math.nan), ValueError, "cost_reduce must be finite"),
        (lambda: simulate(S, model="fast"), ValueError, "model must be one of"),
        (lambda: simulate(S, handoff_latency=-1.0), ValueError, "handoff_latency"),
        (lambda: build_dag(S, cost_compute=math.inf), ValueError, "cost_compute must be finite"),
        (lambda: emulate(S, Q[0], K, V, DO), ValueError, "q must have 4 dims"),
        (lambda: emulate(S, Q, K, V, DO[..., :8]), ValueError, "do must have the shape of q"),
        (lambda: emulate(S, Q.float(), K.float(), V.float(), DO.float()), TypeError,
         "bfloat16 or float16"),
        (lambda: emulate(S, Q, K, V[:, :8], DO), ValueError, "k and v must have one shape"),
        (lambda: attention_f64(Q[0], K, V, DO), ValueError, "q must have 4 dims"),
        (lambda: attention_f64(Q, K, V, DO[..., :8]), ValueError, "do must have the shape"),
        (lambda: attention_f64(Q[:, :, :1], K.repeat(1, 1, 2, 1), V.repeat(1, 1, 2, 1), DO),
         ValueError, "multiple of the key/value heads"),
        (lambda: replay(S, torch.zeros(3, 16, 16)), ValueError, "partials has 3 rows"),
        (lambda: steps.arithmetic("approx"), ValueError, "arithmetic='approx'"),
        (lambda: get_impl("bogus"), ValueError, "unknown implementation"),
        (lambda: get_impl(3), TypeError, "must be a str"),
        (lambda: audit("emulator:naive", P, trials=1, progress=False), ValueError,
         "trials must be >= 2"),
        (lambda: audit("emulator:naive", P, dtype="fp32", progress=False), ValueError,
         "dtype must be one of"),
        (lambda: audit("emulator:naive", "P", progress=False), TypeError,
         "problem must be a dash_ref.Problem"),
        (lambda: fuzz("emulator:naive", budget=0, progress=False), ValueError,
         "budget must be >= 1"),
        (lambda: fuzz("emulator:naive", max_elements=0, progress=False), ValueError,
         "max_elements must be >= 512"),
        (lambda: Case(P, dtype="fp32"), ValueError, "Case.dtype"),
        (lambda: Case(P, schedule="bogus"), ValueError, "Case.schedule"),
        (lambda: check("emulator:naive", "case"), TypeError, "case must be"),
    ] + ([] if not NO_CUDA else [
        (lambda: fuzz("dash:shift", budget=2, progress=False), RuntimeError,
         "needs a CUDA device"),
        (lambda: check("dash:shift", case), RuntimeError, "needs a CUDA device"),
    ])


@pytest.mark.parametrize("index", range(len(_api_cases())))
def test_api_rejects_bad_input_with_a_message_that_names_it(index):
    call, error, words = _api_cases()[index]
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_the_table_covers_at_least_forty_bad_inputs():
    bad_cli = [c for c in CLI_CASES + CUDA_CASES if c[1] == 2]
    assert len(bad_cli) + len(_api_cases()) >= 40
