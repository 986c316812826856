"""Sliding windows through the implementation-running commands: ``check``, ``audit``, ``fuzz``.

An implementation that takes a window (``Impl.windows``) gets ``window_size=`` as a keyword
only when the problem has one, and the float64 reference runs the same window; one that
takes none is refused (exit 2, one line) rather than run without it.
"""

from __future__ import annotations

import json

import pytest
import torch
from cli_output import reproducer_argv

from dash_ref import Problem
from verify.cli import main
from verify.impls import Impl, get_impl
from verify.strategies import Case

WINDOWED = ["--seqlen-q", "64", "--head-dim", "16", "--mask", "causal",
            "--window-size", "8", "0"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_check_runs_the_emulator_under_the_window_and_says_so(capsys):
    code, out, err = _run(capsys, ["check", "--impl", "emulator:banded", *WINDOWED,
                                   "--json"])
    assert code == 0, err
    result = json.loads(out)["result"]
    assert result["ok"] and result["window_size"] == [8, 0]
    assert "--window-size 8 0" in result["case"]


def test_check_catches_an_implementation_that_ignores_the_window(capsys):
    code, out, _ = _run(capsys, ["check", "--impl", "planted:ignores_window", *WINDOWED])
    assert code == 1 and out.startswith("FAIL planted:ignores_window")
    # the same shape without the window passes: what is caught is the window
    assert main(["check", "--impl", "planted:ignores_window", *WINDOWED[:-3]]) == 0
    # and a helper that runs the window passes with it
    assert main(["check", "--impl", "planted:windowed_reference", *WINDOWED]) == 0


@pytest.mark.parametrize("impl", ["sdpa-math", "planted:reference_cast"])
@pytest.mark.parametrize("command", [["check"], ["audit", "--trials", "2"]])
def test_an_implementation_without_windows_is_refused_in_one_line(capsys, command, impl):
    code, out, err = _run(capsys, [*command, "--impl", impl, *WINDOWED])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and impl in err and "--window-size 8 0" in err


def test_audit_runs_the_window(capsys):
    code, out, err = _run(capsys, ["audit", "--impl", "emulator:descending", *WINDOWED,
                                   "--trials", "3", "--json"])
    assert code == 0, err
    document = json.loads(out)
    assert document["result"]["deterministic"]
    assert document["result"]["problem"]["window_size"] == [8, 0]
    assert "window=(8, 0)" in err  # the report goes to stderr under --json


def test_fuzz_with_windows_finds_the_ignored_window_and_reproduces_it(capsys):
    code, out, _ = _run(capsys, ["fuzz", "--impl", "planted:ignores_window", "--windows",
                                 "--budget", "40", "--max-elements", "4000"])
    assert code == 1
    argv = reproducer_argv(out)
    assert "--window-size" in argv
    assert main(argv) == 1
    capsys.readouterr()
    # without --windows the same helper passes: fuzz draws no window unless asked
    assert main(["fuzz", "--impl", "planted:ignores_window", "--budget", "5",
                 "--max-elements", "4000"]) == 0


def test_fuzz_with_windows_passes_the_emulator_and_refuses_sdpa(capsys):
    assert main(["fuzz", "--impl", "emulator:banded", "--windows", "--budget", "8",
                 "--max-elements", "4000"]) == 0
    code, out, err = _run(capsys, ["fuzz", "--impl", "sdpa-math", "--windows",
                                   "--budget", "2"])
    assert code == 2 and err.count("\n") == 1 and "sdpa-math" in err and "--windows" in err


def test_the_window_is_a_keyword_passed_only_when_there_is_one():
    seen = []

    def six(q, k, v, do, causal, softmax_scale):
        seen.append("six")
        return q, k, v, do

    def seven(q, k, v, do, causal, softmax_scale, **kw):
        seen.append(kw)
        return q, k, v, do

    x = torch.zeros(1, 4, 1, 8)
    Impl("six", six)(x, x, x, x, False, 1.0)
    Impl("seven", seven, windows=True)(x, x, x, x, False, 1.0)
    Impl("seven", seven, windows=True)(x, x, x, x, True, 1.0, window_size=[3, 0])
    assert seen == ["six", {}, {"window_size": (3, 0)}]
    with pytest.raises(ValueError, match="six takes no sliding window.*--window-size 3 0"):
        Impl("six", six)(x, x, x, x, True, 1.0, window_size=(3, 0))
    assert seen == ["six", {}, {"window_size": (3, 0)}]  # never run without it


def test_which_implementations_take_windows():
    assert get_impl("emulator:naive").windows and get_impl("emulator:banded").windows
    assert not get_impl("sdpa-math").windows
    assert get_impl("planted:ignores_window").windows
    assert not get_impl("planted:reference_cast").windows


def test_fa4_gets_none_for_an_unbounded_side(monkeypatch):
    from verify import impls

    calls = []

    def fake(q, k, v, **kwargs):
        calls.append(kwargs)
        return q * 1.0

    monkeypatch.setattr(impls, "load_fa4", lambda: fake)
    impl = get_impl("fa4-det")
    assert impl.windows
    x = torch.randn(1, 4, 1, 8)
    impl(x, x, x, x, False, 1.0)
    impl(x, x, x, x, False, 1.0, window_size=(-1, 2))
    impl(x, x, x, x, True, 1.0, window_size=(5, 0))
    assert [c.get("window_size", "absent") for c in calls] == ["absent", (None, 2), (5, 0)]
    assert all(c["deterministic"] for c in calls)


def test_a_windowed_case_rebuilds_from_its_flags():
    p = Problem(1, 2, 1, 40, 33, 16, "full", 16, 16, None, None, (5, -1))
    flags = Case(p, "fp16", "banded", 7).flags()
    assert "--window-size 5 -1 " in flags and "--schedule banded" in flags
    unwindowed = Case(Problem(1, 2, 1, 40, 33, 16, "full", 16, 16), "fp16").flags()
    assert "--window-size" not in unwindowed
