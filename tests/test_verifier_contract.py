"""The verifier cannot be fooled: every broken implementation is a finding, the same everywhere.

A table of broken implementations (``tests/broken_impls.py``) runs through ``dash-verify
audit``, ``check`` and ``fuzz``: each must exit 1 (a finding, never 0 and never 2) with a
report that names what broke, and never a traceback. Implementations that cannot be
loaded exit 2 in all three. Bad values on the command line and at the Python API are
refused with exit 2 / the exception type, naming the rule. The numbers of cases are
counted at the end: the issue asks for at least 60.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from dash_ref import Problem
from verify.cli import main
from verify.contract import ContractViolation, check_outputs

SHAPE = ["--seqlen-q", "24", "--heads", "1", "--head-dim", "16"]
RUN = {  # each command on one tiny shape, as quick as it goes
    "audit": ["audit", *SHAPE, "--trials", "2", "--no-perturb"],
    "check": ["check", *SHAPE],
    "fuzz": ["fuzz", "--budget", "2", "--max-elements", "512"],
}

# (function in broken_impls, words the report must contain)
BROKEN = [
    ("three_outputs", "returned 3 outputs, expected 4 (O, dQ, dK, dV); missing: dV"),
    ("five_outputs", "returned 5 outputs, expected 4"),
    ("no_outputs", "returned 0 outputs"),
    ("one_tensor", "returned a Tensor, expected a tuple of 4 tensors"),
    ("returns_none", "returned a NoneType"),
    ("returns_dict", "returned a dict"),
    ("returns_generator", "returned a generator"),
    ("dv_as_list", "dV: expected a torch.Tensor, got list"),
    ("o_as_numpy", "O: expected a torch.Tensor, got ndarray"),
    ("dq_is_none", "dQ: expected a torch.Tensor, got NoneType"),
    ("o_one_rank_more", "O: expected shape"),
    ("dq_without_batch", "dQ: expected shape"),
    ("dk_one_row_short", "dK: expected shape"),
    ("dv_flattened", "dV: expected shape"),
    ("empty_outputs", "O: expected shape"),
    ("float64_outputs", "O: expected dtype torch.bfloat16 (the inputs'), got torch.float64"),
    ("float32_dv", "dV: expected dtype torch.bfloat16"),
    ("fp16_for_bf16", "O: expected dtype torch.bfloat16 (the inputs'), got torch.float16"),
    ("integer_outputs", "got torch.int64"),
    ("meta_outputs", "O: expected device cpu (the inputs'), got meta"),
    ("all_nan", "O: expected finite values for finite inputs"),
    ("one_inf_in_dk", "dK: expected finite values for finite inputs, got 1 of"),
    ("raises", "raised RuntimeError: boom"),
    ("raises_memory_error", "raised MemoryError: out of memory"),
    ("exits_3", "called exit(3)"),
    ("exits_0", "called exit(0)"),
    ("exits_with_text", "called exit('giving up')"),
    ("interrupts_itself", "raised KeyboardInterrupt"),
]
BROKEN_CASES = [(command, fn, words) for fn, words in BROKEN for command in RUN]

# implementations that cannot be loaded: bad usage or environment, exit 2 in every command
UNLOADABLE = [
    ("broken_import_raises:anything", "cannot import module 'broken_import_raises'"),
    ("broken_import_exits:anything", "cannot import module 'broken_import_exits'"),
    ("no_such_module_here:fn", "cannot import module 'no_such_module_here'"),
    ("broken_impls:not_there", "has no callable 'not_there'"),
]
UNLOADABLE_CASES = [(command, impl, words) for impl, words in UNLOADABLE for command in RUN]

# bad values on the command line: exit 2, one line naming the flag and the rule
BAD_ARGS = [
    (["schedule", "--seqlen-q", "١٢"], ["--seqlen-q", "ASCII digits"]),
    (["schedule", "--seqlen-q", "1_024"], ["--seqlen-q", "expected an integer"]),
    (["schedule", "--seqlen-q", " 64"], ["--seqlen-q", "expected an integer"]),
    (["schedule", "--seqlen-q", "1e3"], ["--seqlen-q", "expected an integer"]),
    (["schedule", "--seqlen-q", "64.0"], ["--seqlen-q", "expected an integer"]),
    (["schedule", "--seqlen-q", "99999999999"], ["--seqlen-q", "must be <="]),
    (["schedule", "--heads", "true"], ["--heads", "expected an integer"]),
    (["simulate", "--cost-compute", "0x10"], ["--cost-compute", "expected a number"]),
    (["simulate", "--cost-compute", "١"], ["--cost-compute", "expected a number"]),
    (["simulate", "--cost-reduce=-inf"], ["--cost-reduce", "finite"]),
    (["simulate", "--cost-reduce", "1e400"], ["--cost-reduce", "finite"]),
    (["audit", "--impl", "emulator:naive", "--timeout", "0"], ["--timeout", "> 0"]),
    (["audit", "--impl", "emulator:naive", "--timeout", "nan"], ["--timeout"]),
    (["check", "--impl", "emulator:naive", "--timeout", "-1"], ["--timeout"]),
    (["fuzz", "--impl", "emulator:naive", "--timeout", "soon"], ["--timeout", "number"]),
    (["check", "--impl", "sdpa-math", *SHAPE, "--block-m", "32"],
     ["--block-m", "sdpa-math chooses its own tiles"]),
    (["audit", "--impl", "planted:reference_cast", *SHAPE, "--block-n", "32"],
     ["--block-n", "chooses its own tiles"]),
    (["fuzz", "--impl", "emulator:naive", "--seed", "-1"], ["--seed", ">= 0"]),
    # the cost budget: refused before any work, with the estimate and the way round it
    (["schedule", "--seqlen-q", "1000000000"], ["would take about", "--allow-large"]),
    (["schedule", "--workers", "100000000"], ["100000000 workers", "--allow-large"]),
    (["simulate", "--seqlen-q", "4000000", "--block-m", "16", "--block-n", "16"],
     ["tile visits", "over the budget"]),
    (["demo", "--seqlen", "2048"], ["S = 2048", "--allow-large"]),
    (["audit", "--impl", "emulator:naive", "--seqlen-q", "4096"],
     ["100 emulator calls", "--allow-large"]),
    (["check", "--impl", "emulator:naive", "--seqlen-q", "65536", "--heads", "8"],
     ["1 emulator calls", "--allow-large"]),
]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


@pytest.mark.parametrize("command, fn, words", BROKEN_CASES,
                         ids=[f"{c}-{f}" for c, f, _ in BROKEN_CASES])
def test_a_broken_implementation_is_a_finding_in_every_command(command, fn, words, capsys):
    code, out, err = _run(capsys, [*RUN[command], "--impl", f"broken_impls:{fn}"])
    assert code == 1, (out, err)
    assert words in out, out
    assert "DETERMINISTIC: one bit pattern" not in out and "PASS" not in out


@pytest.mark.parametrize("command, impl, words", UNLOADABLE_CASES,
                         ids=[f"{c}-{i}" for c, i, _ in UNLOADABLE_CASES])
def test_an_implementation_that_cannot_be_loaded_is_exit_2_everywhere(command, impl, words,
                                                                      capsys):
    code, out, err = _run(capsys, [*RUN[command], "--impl", impl])
    assert code == 2 and out == ""
    # what the module printed while it was imported goes to stderr, before the one line
    ours = [line for line in err.splitlines() if line.startswith("dash-verify")]
    assert len(ours) == 1 and words in ours[0] and err.endswith(ours[0] + "\n"), err


@pytest.mark.parametrize("argv, words", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_a_bad_value_on_the_command_line_is_exit_2_naming_the_rule(argv, words, capsys):
    code, out, err = _run(capsys, argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("command", RUN)
def test_a_hang_past_the_timeout_is_a_finding(command, capsys):
    code, out, _ = _run(capsys, [*RUN[command], "--impl", "broken_impls:hangs",
                                 "--timeout", "0.2"])
    assert code == 1 and "no result within 0.2 s (--timeout)" in out


@pytest.mark.parametrize("command", RUN)
def test_what_an_implementation_prints_stays_off_the_json_on_stdout(command, capfd):
    code = main([*RUN[command], "--impl", "broken_impls:prints", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    document = json.loads(out)  # stdout holds the JSON document and nothing else
    assert document["exit_code"] == 0 and document["command"] == command
    assert "a line from the implementation" in err and "and another" in err


@pytest.mark.parametrize("command", RUN)
def test_a_finding_is_recorded_in_the_json_envelope(command, capsys):
    code = main([*RUN[command], "--impl", "broken_impls:three_outputs", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1 and document["exit_code"] == 1
    assert "missing: dV" in document["summary"]


# -- the Python API --------------------------------------------------------------------------
P = Problem(1, 1, 1, 24, 24, 16, "full", 16, 16)


def _api_cases():
    from dash_cuda import backward_problem
    from dash_ref._checks import boolean, number
    from dash_ref.emulate import backward, emulate, forward
    from verify.audit import audit
    from verify.compare import compare
    from verify.fuzz import check, fuzz
    from verify.highprec import error_bound
    from verify.impls import get_impl
    from verify.strategies import Case, problems

    x = torch.zeros(1, 8, 1, 16, dtype=torch.bfloat16)
    return [
        (lambda: audit("emulator:naive", Problem(1, 1, 1, 0, 24, 16), progress=False),
         ValueError, "no attention to audit"),
        (lambda: audit("emulator:naive", Problem(1, 1, 1, 24, 0, 16), progress=False),
         ValueError, "seqlen_k=0"),
        (lambda: audit("emulator:naive", P, softmax_scale="0.25", progress=False), TypeError,
         "softmax_scale must be a number"),
        (lambda: audit("emulator:naive", P, softmax_scale=True, progress=False), TypeError,
         "softmax_scale must be a number"),
        (lambda: audit("emulator:naive", P, softmax_scale=math.inf, progress=False),
         ValueError, "softmax_scale must be finite"),
        (lambda: audit("emulator:naive", P, softmax_scale=0.0, progress=False), ValueError,
         "softmax_scale must be > 0"),
        (lambda: audit("emulator:naive", P, timeout=0, progress=False), ValueError,
         "timeout must be > 0"),
        (lambda: audit("emulator:naive", P, timeout="5", progress=False), TypeError,
         "timeout must be a number"),
        (lambda: audit(3, P, progress=False), TypeError, "impl must be a name"),
        (lambda: audit("emulator:naive", P, perturb="yes", progress=False), TypeError,
         "perturb must be a bool"),
        (lambda: audit("emulator:naive", P, seed=-1, progress=False), ValueError,
         "seed must be >= 0"),
        (lambda: audit("sdpa-math", P, tiles=(32, 32), progress=False), ValueError,
         "chooses its own tiles"),
        (lambda: check("emulator:naive", Case(P), timeout=-1.0), ValueError,
         "timeout must be > 0"),
        (lambda: fuzz("emulator:naive", rng_seed=-1, progress=False), ValueError,
         "rng_seed must be >= 0"),
        (lambda: get_impl("emulator:naive", tiles=(0, 16)), ValueError, "block_m must be >= 1"),
        (lambda: get_impl("emulator:naive", tiles=(16.0, 16)), TypeError,
         "block_m must be an int"),
        (lambda: get_impl("broken_import_exits:x"), ValueError, "cannot import module"),
        (lambda: number("x", "1.5"), TypeError, "x must be a number"),
        (lambda: boolean("causal", "yes"), TypeError, "causal must be a bool"),
        (lambda: boolean("causal", 1), TypeError, "causal must be a bool"),
        (lambda: error_bound(torch.bfloat16, kappa=math.nan), ValueError,
         "kappa must be >= 0 (inf allowed), got nan"),
        (lambda: error_bound(torch.bfloat16, kappa="2"), TypeError, "kappa must be a number"),
        (lambda: error_bound(torch.bfloat16, seqlen_q=-1), ValueError, "seqlen_q must be >= 0"),
        (lambda: compare("dq", torch.ones(2, dtype=torch.int64),
                         torch.ones(2, dtype=torch.int64)), TypeError,
         "compare takes floating-point tensors"),
        (lambda: compare("dq", [1.0], torch.ones(1)), TypeError, "got list"),
        (lambda: problems(head_dims=(0,)), ValueError, "head_dims[...] must be >= 1"),
        (lambda: problems(blocks=((16, 0),)), ValueError, "blocks[...] must be >= 1"),
        (lambda: problems(max_elements=0), ValueError, "max_elements must be >= 1"),
        (lambda: backward_problem(1, 1, 1, 64, 64, 48, False), ValueError,
         "head_dim 48 is not supported"),
        (lambda: backward_problem(1, 1, 1, 64, 64, 64, "yes"), TypeError,
         "causal must be a bool"),
        (lambda: backward_problem(1, 1, 1, 64.0, 64, 64, False), TypeError,
         "seqlen_q must be an int"),
        (lambda: backward_problem(1, 1, 1, 64, 64, 64, False, backend="bogus"), ValueError,
         "unknown backend"),
        (lambda: forward(x, x, x, causal="yes"), TypeError, "causal must be a bool"),
        (lambda: forward(x, x, x, softmax_scale="0.25"), TypeError,
         "softmax_scale must be a number"),
        (lambda: forward(x, x, x, softmax_scale=True), TypeError,
         "softmax_scale must be a number"),
        (lambda: forward(x, x, x, softmax_scale=math.inf), ValueError,
         "softmax_scale must be finite"),
        (lambda: emulate(None, x, x, x, x), TypeError, "schedule must be a dash_ref.Schedule"),
        (lambda: backward(None, x, x, x, x, x[..., 0].float(), x), TypeError,
         "schedule must be a dash_ref.Schedule"),
    ]


@pytest.mark.parametrize("index", range(len(_api_cases())))
def test_the_api_refuses_a_bad_value_naming_it(index):
    call, error, words = _api_cases()[index]
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_the_contract_accepts_what_it_should():
    q = torch.zeros(1, 3, 2, 4, dtype=torch.bfloat16)
    k = torch.zeros(1, 5, 1, 4, dtype=torch.bfloat16)
    good = (q.clone(), q.clone(), k.clone(), k.clone())
    assert check_outputs(list(good), q, k, k, q) == good
    # non-finite inputs: non-finite outputs are not a violation of the contract
    q_inf = q.clone()
    q_inf[0, 0, 0, 0] = math.inf
    nan = tuple(torch.full_like(x, math.nan) for x in good)
    check_outputs(nan, q_inf, k, k, q)
    with pytest.raises(ContractViolation, match="O: expected finite"):
        check_outputs(nan, q, k, k, q)


def test_the_contract_takes_the_values_head_dim():
    """O has q's rows and v's head dim (dO's shape), dV has v's: an output shaped like q
    where v has a head dim of its own is a violation."""
    q = torch.randn(1, 3, 2, 4).to(torch.bfloat16)
    k = torch.randn(1, 5, 1, 4).to(torch.bfloat16)
    v, do = torch.randn(1, 5, 1, 2).to(torch.bfloat16), torch.randn(1, 3, 2, 2).to(torch.bfloat16)
    good = (do.clone(), q.clone(), k.clone(), v.clone())
    assert check_outputs(list(good), q, k, v, do) == good
    with pytest.raises(ContractViolation, match=r"O: expected shape \(1, 3, 2, 2\) \(that of do\)"):
        check_outputs((q.clone(), *good[1:]), q, k, v, do)
    with pytest.raises(ContractViolation, match=r"dV: expected shape \(1, 5, 1, 2\) \(that of v\)"):
        check_outputs((*good[:3], k.clone()), q, k, v, do)


VALUE_DIM = ["--seqlen-q", "24", "--heads", "2", "--head-dim", "16", "--head-dim-v", "8"]


@pytest.mark.parametrize("command", ["audit", "check"])
def test_a_value_head_dim_on_the_command_line_reaches_the_implementation(command, capsys):
    extra = ["--trials", "2", "--no-perturb"] if command == "audit" else []
    code, out, _ = _run(capsys, [command, "--impl", "emulator:shift", *VALUE_DIM, *extra])
    assert code == 0, out
    assert "d=16 d_v=8" in out if command == "audit" else "PASS" in out
    code, out, _ = _run(capsys, [command, "--impl", "broken_impls:o_with_the_query_head_dim",
                                 *VALUE_DIM, *extra])
    assert code == 1 and "O: expected shape (1, 24, 2, 8) (that of do)" in out, out


def test_fuzzing_with_value_head_dims_finds_an_output_shaped_like_q(capsys):
    argv = ["fuzz", "--budget", "40", "--max-elements", "4000", "--value-head-dims", "8"]
    code, out, _ = _run(capsys, [*argv, "--impl", "emulator:naive"])
    assert code == 0, out
    code, out, _ = _run(capsys, [*argv, "--impl", "broken_impls:o_with_the_query_head_dim"])
    assert code == 1 and "O: expected shape" in out, out
    assert "--head-dim-v 8" in out  # the reproducer rebuilds the failing value head dim
    code, out, _ = _run(capsys, ["fuzz", "--budget", "40", "--max-elements", "4000",
                                 "--impl", "broken_impls:o_with_the_query_head_dim"])
    assert code == 0, out  # without them it is right: the finding is the value head dim's


def test_the_tables_hold_at_least_sixty_bad_inputs_and_broken_implementations():
    new = (len(BROKEN_CASES) + len(UNLOADABLE_CASES) + len(BAD_ARGS) + 2 * len(RUN)
           + len(_api_cases()))
    assert new >= 60, new


# -- the tiles: emulator:NAME runs what --block-m/--block-n ask for, and says so ---------------
def test_the_emulator_runs_the_tiles_asked_for_and_the_json_records_them(capsys):
    base = ["check", "--impl", "emulator:shift", "--seqlen-q", "64", "--heads", "2",
            "--head-dim", "32", "--json"]
    errors = {}
    for bn in (16, 32):
        assert main([*base, "--block-m", "32", "--block-n", str(bn)]) == 0
        result = json.loads(capsys.readouterr().out)["result"]
        assert result["tiles"] == [32, bn]
        assert f"--block-m 32 --block-n {bn}" in result["case"]
        errors[bn] = result["errors"]
    # other KV tiles: another online softmax and other dQ partial sums, so other rounding
    assert errors[16] != errors[32]


def test_probabilities_that_underflow_in_fp16_are_held_to_their_rounding(capsys):
    """A sink logit far above the only score puts P at about e**-12, below fp16's normal
    range, where the kernels' rounding of P is absolute: a correct emulation passes (the
    case fuzzing found before the bound took gradual underflow)."""
    argv = ["check", "--impl", "emulator:naive", "--batch", "1", "--seqlen-q", "1",
            "--seqlen-k", "1", "--heads", "1", "--heads-kv", "1", "--head-dim", "16",
            "--mask", "causal", "--learnable-sink=12.0", "--block-m", "16", "--block-n",
            "16", "--dtype", "fp16", "--schedule", "naive", "--seed", "0"]
    code, out, _ = _run(capsys, argv)
    assert code == 0, out
    assert "PASS" in out


def test_an_implementation_that_chooses_its_tiles_records_none(capsys):
    assert main(["audit", "--impl", "planted:reference_cast", *SHAPE, "--trials", "2",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["tiles"] is None


def test_the_emulator_tiles_change_its_bits_both_ways():
    """--block-m and --block-n both reach the emulator: other tiles, other sums, other bits."""
    from verify.impls import get_impl
    from verify.strategies import Case

    q, k, v, do = Case(Problem(1, 2, 2, 128, 128, 32, "full", 16, 16)).tensors()

    def bits(tiles):
        outs = get_impl("emulator:shift", tiles=tiles)(q, k, v, do, False, 0.17)
        return torch.cat([x.reshape(-1).view(torch.int16) for x in outs])

    base = bits((16, 16))
    assert not torch.equal(base, bits((64, 16)))  # BM: the dQ tiles and dK's visits
    assert not torch.equal(base, bits((16, 64)))  # BN: the online softmax and dQ's sums


def test_a_timed_out_call_that_prints_later_writes_to_stderr(capsys):
    """The call goes on in its thread after the timeout; its prints must not reach stdout."""
    import threading
    import time

    from verify import guard
    from verify.contract import Finding

    go = threading.Event()

    def late():
        go.wait(5)
        print("LATE-PRINT")

    with pytest.raises(Finding, match="no result within"):
        guard.call(late, timeout=0.05)
    go.set()
    deadline = time.time() + 5
    while any(t.is_alive() for t in guard._Router.abandoned) and time.time() < deadline:
        time.sleep(0.01)
    out, err = capsys.readouterr()
    assert "LATE-PRINT" not in out and "LATE-PRINT" in err
