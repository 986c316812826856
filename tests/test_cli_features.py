"""Softcap and learnable sinks through the implementation-running commands: ``check``,
``audit``, ``fuzz``.

An implementation that takes them (``Impl.features``) gets ``softcap=`` and
``learnable_sink=`` as keywords only when the call has them, and with sinks returns a fifth
output, their gradient ``dsink``, which the contract, the float64 check and the audit hold
like the others; one that takes neither is refused (exit 2, one line) rather than run
without. A reproducer writes the features as flags that rebuild the same case.
"""

from __future__ import annotations

import json
import shlex

import pytest
import torch
from cli_output import reproducer_argv
from hypothesis import given, settings
from hypothesis import strategies as st

from verify.cli import main
from verify.impls import Impl, get_impl
from verify.strategies import Case, feature_cases

SHAPE = ["--seqlen-q", "40", "--seqlen-k", "50", "--heads", "2", "--head-dim", "16",
         "--mask", "causal"]
CAP = ["--softcap", "5"]
SINKS = ["--learnable-sink=-1.5,2"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_check_holds_the_emulator_and_its_dsink_to_the_reference(capsys):
    code, out, err = _run(capsys, ["check", "--impl", "emulator:shift", *SHAPE, *CAP, *SINKS,
                                   "--json"])
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["ok"] and set(result["errors"]) == {"o", "dq", "dk", "dv", "dsink"}
    assert "--softcap 5.0 --learnable-sink=-1.5,2.0 " in result["case"]


@pytest.mark.parametrize("impl, flags, kind", [
    ("planted:ignores_softcap", CAP, "dq error"),
    ("planted:zero_dsink", SINKS, "dsink error"),
    ("planted:forgets_dsink", SINKS, "returned 4 outputs, expected 5 (O, dQ, dK, dV, dsink); "
                                     "missing: dsink"),
])
def test_check_catches_what_a_feature_bug_gets_wrong(capsys, impl, flags, kind):
    code, out, _ = _run(capsys, ["check", "--impl", impl, *SHAPE, *flags])
    assert code == 1 and out.startswith(f"FAIL {impl}") and kind in out
    # the same helper passes without the feature, and the correct one with it
    assert main(["check", "--impl", impl, *SHAPE]) == 0
    assert main(["check", "--impl", "planted:featured_reference", *SHAPE, *flags]) == 0


def test_a_dsink_of_the_wrong_dtype_breaks_the_contract(capsys, monkeypatch):
    import planted

    def cast(*args, **kwargs):
        out = planted.featured_reference(*args, **kwargs)
        return (*out[:4], out[4].double())

    cast.takes_sinks = True
    monkeypatch.setattr(planted, "wrong_dsink_dtype", cast, raising=False)
    code, out, _ = _run(capsys, ["check", "--impl", "planted:wrong_dsink_dtype", *SHAPE,
                                 *SINKS])
    assert code == 1 and ("dsink: expected dtype torch.float32 (learnable_sink's), got "
                          "torch.float64") in out


@pytest.mark.parametrize("impl", ["sdpa-math", "planted:reference_cast"])
@pytest.mark.parametrize("flags", [CAP, SINKS], ids=["softcap", "sinks"])
@pytest.mark.parametrize("command", [["check"], ["audit", "--trials", "2"]])
def test_an_implementation_without_the_feature_is_refused_in_one_line(capsys, command, flags,
                                                                      impl):
    code, out, err = _run(capsys, [*command, "--impl", impl, *SHAPE, *flags])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and impl in err and ("takes no softcap" in err
                                                     or "takes no learnable sinks" in err)


def test_audit_counts_dsink_patterns_and_finds_an_order_dependent_one(capsys):
    code, out, err = _run(capsys, ["audit", "--impl", "emulator:descending", *SHAPE, *CAP,
                                   *SINKS, "--trials", "3", "--json"])
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["deterministic"] and result["outputs"]["dsink"]["distinct"] == 1
    assert result["softcap"] == 5.0 and result["learnable_sink"] == [-1.5, 2.0]
    assert "softcap=5 sinks" in err
    code, out, _ = _run(capsys, ["audit", "--impl", "planted:shuffled_dsink", *SHAPE, *SINKS,
                                 "--trials", "6", "--no-perturb"])
    assert code == 1 and "NOT DETERMINISTIC" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[4:9]}
    assert rows == {"O": "1", "dQ": "1", "dK": "1", "dV": "1", "dsink": rows["dsink"]}
    assert int(rows["dsink"]) > 1


def test_sinks_with_the_wrong_count_are_a_usage_error(capsys):
    code, out, err = _run(capsys, ["check", "--impl", "emulator:naive", *SHAPE,
                                   "--learnable-sink", "1,2,3"])
    assert code == 2 and out == "" and "3 logits" in err and "2 query heads" in err


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "x"])
def test_a_bad_softcap_is_a_usage_error(capsys, text):
    code, out, err = _run(capsys, ["check", "--impl", "emulator:naive", *SHAPE,
                                   "--softcap", text])
    assert code == 2 and out == "" and "--softcap" in err


def test_fuzz_draws_the_features_finds_a_dsink_bug_and_reproduces_it(capsys):
    code, out, _ = _run(capsys, ["fuzz", "--impl", "planted:zero_dsink", "--sinks",
                                 "--budget", "30", "--max-elements", "4000"])
    assert code == 1
    argv = reproducer_argv(out)
    assert any(a.startswith("--learnable-sink=") for a in argv)
    assert main(argv) == 1
    capsys.readouterr()
    # without --sinks the same helper passes: fuzz draws no sinks unless asked
    assert main(["fuzz", "--impl", "planted:zero_dsink", "--budget", "5",
                 "--max-elements", "4000"]) == 0


def test_fuzz_with_both_features_passes_the_emulator_and_refuses_sdpa(capsys):
    assert main(["fuzz", "--impl", "emulator:shift", "--softcaps", "--sinks", "--budget",
                 "8", "--max-elements", "4000"]) == 0
    for flag in ("--softcaps", "--sinks"):
        code, _, err = _run(capsys, ["fuzz", "--impl", "sdpa-math", flag, "--budget", "2"])
        assert code == 2 and err.count("\n") == 1 and flag in err


def test_the_features_are_keywords_passed_only_when_set():
    seen = []

    def call(q, k, v, do, causal, softmax_scale, **kw):
        seen.append(sorted(kw))
        return q, k, v, do

    x, sink = torch.zeros(1, 4, 1, 8), torch.zeros(1)
    impl = Impl("featured", call, features=("softcap", "sinks"))
    impl(x, x, x, x, False, 1.0)
    impl(x, x, x, x, False, 1.0, softcap=2.0)
    impl(x, x, x, x, False, 1.0, learnable_sink=sink)
    assert seen == [[], ["softcap"], ["learnable_sink"]]
    with pytest.raises(ValueError, match="plain takes no learnable sinks"):
        Impl("plain", call)(x, x, x, x, False, 1.0, learnable_sink=sink)
    assert len(seen) == 3  # never run without it


def test_which_implementations_take_the_features():
    for name in ("emulator:naive", "planted:featured_reference"):
        assert get_impl(name).features == ("softcap", "sinks")
    for name in ("sdpa-math", "planted:reference_cast"):
        assert get_impl(name).features == ()


def test_fa4_is_given_the_features_and_returns_dsink(monkeypatch):
    from verify import impls

    calls = []

    def fake(q, k, v, **kwargs):
        calls.append(kwargs)
        sink = kwargs["learnable_sink"]
        return q * 1.0 + (0.0 if sink is None else sink.sum())

    monkeypatch.setattr(impls, "load_fa4", lambda: fake)
    x = torch.randn(1, 4, 2, 8)
    out = get_impl("fa4")(x, x, x, x, False, 1.0, softcap=3.0,
                          learnable_sink=torch.tensor([0.5, 1.0]))
    assert calls[0]["softcap"] == 3.0 and calls[0]["learnable_sink"].requires_grad
    # dsink is the sink leaf's gradient: d(sum(O * dO)) / d sink_h = sum(dO) for each head
    assert len(out) == 5 and out[4].shape == (2,) and torch.equal(out[4][0], out[4][1])
    assert torch.allclose(out[4][0], x.sum(), rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(st.one_of(feature_cases(max_elements=4000),
                 feature_cases(max_elements=4000, packed=True)))
def test_a_case_rebuilds_from_its_flags(case):
    """The reproducer's flags, read by ``dash-verify check``'s own parser, give back the same
    case: its lengths (packed ones too), window, value head dim, tiles, softcap and sink
    logits exactly."""
    from verify.cli import build_parser
    from verify.cli.args import case_from_args

    args = build_parser().parse_args(["check", "--impl", "emulator:naive",
                                      *shlex.split(case.flags())])
    assert case_from_args(args) == case


# -- packed batches through check and fuzz ----------------------------------------------------
PACKED = ["--seqlens-q", "37,0,64,20", "--seqlens-k", "50,12,64,9", "--heads", "2",
          "--heads-kv", "1", "--head-dim", "16", "--mask", "causal"]


def test_check_holds_each_packed_sequence_to_its_own_bound(capsys):
    code, out, err = _run(capsys, ["check", "--impl", "emulator:lpt", *PACKED, *CAP, *SINKS,
                                   "--json"])
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["ok"] and set(result["errors"]) == {"o", "dq", "dk", "dv", "dsink"}
    assert result["case"].startswith("--seqlens-q 37,0,64,20 --seqlens-k 50,12,64,9 ")
    code, out, _ = _run(capsys, ["check", "--impl", "planted:one_long_sequence", *PACKED])
    assert code == 1 and "sequence 0: o error" in out
    assert main(["check", "--impl", "planted:packed_reference", *PACKED]) == 0
    # one sequence is a rectangular problem: the helper's bug cannot show there
    assert main(["check", "--impl", "planted:one_long_sequence", "--seqlens-q", "40",
                 "--seqlens-k", "50", *PACKED[4:]]) == 0


def test_fuzz_draws_packed_batches_finds_the_packing_bug_and_reproduces_it(capsys):
    code, out, _ = _run(capsys, ["fuzz", "--impl", "planted:one_long_sequence", "--packed",
                                 "--budget", "30", "--max-elements", "6000"])
    assert code == 1
    argv = reproducer_argv(out)
    assert "--seqlens-q" in argv and "--batch" not in argv
    assert main(argv) == 1
    capsys.readouterr()
    assert main(["fuzz", "--impl", "emulator:lpt", "--packed", "--sinks", "--softcaps",
                 "--windows", "--budget", "6", "--max-elements", "6000"]) == 0
    code, _, err = _run(capsys, ["fuzz", "--impl", "sdpa-math", "--packed", "--budget", "2"])
    assert code == 2 and "takes no packed batches" in err


# -- dash_cuda's own checks (L1, and L2 with exact=True) with the options, in the interpreter --
@pytest.fixture(scope="module")
def interpreted_checks(tmp_path_factory):
    """``verify.fuzz.check`` of the Triton kernels, through ``dash_cuda``, in Triton's CPU
    interpreter with the GPU's rounding models: the float64 bound, L1 (the replay of the
    audited partials) and, for ``dash-exact``, L2 of every step, ``dsink`` included."""
    pytest.importorskip("triton.runtime.interpreter")
    from triton_interpreter import run

    from dash_ref import Problem

    packed = Problem.packed((37, 0, 64, 20), (50, 12, 64, 9), 2, 1, 16, "causal", 16, 16)
    square = Problem(1, 2, 2, 70, 90, 32, "full", 16, 16, window_size=(30, 10))
    cases = [("dash-exact:lpt", Case(packed, "bf16", "lpt", 3, 20.0, (0.5, -1.0))),
             ("dash-triton:lpt", Case(packed, "fp16", "lpt", 4, 0.0, (2.0, -3.0))),
             ("dash-exact:banded", Case(square, "bf16", "banded", 5, 30.0, (1.0, -4.0)))]
    calls = [dict(kind="check", impl=name, flags=case.flags(tiles=False), q=None, k=None,
                  v=None) for name, case in cases]
    return run(calls, tmp_path_factory.mktemp("checks"), hopper=True)


@pytest.mark.parametrize("index", range(3), ids=["exact-packed", "default-packed",
                                                 "exact-window"])
def test_dash_cuda_passes_its_own_checks_with_the_options(interpreted_checks, index):
    out = interpreted_checks[index]["out"]
    assert out["ok"], out["message"]
    assert set(out["errors"]) == {"o", "dq", "dk", "dv", "dsink"}
