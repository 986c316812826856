"""``dash-verify schedule`` and ``dash-verify simulate`` through ``verify.cli.main``."""

from __future__ import annotations

import json

import pytest

import verify.cli as cli
from dash_ref import NAMES, Problem, build_schedule

SHAPE = ["--seqlen-q", "64", "--seqlen-k", "48", "--block-m", "16", "--block-n", "16",
         "--batch", "2", "--heads", "2", "--workers", "3"]


@pytest.fixture
def run(capsys: pytest.CaptureFixture):
    """Run ``dash-verify ARGS``: its return code, stdout and stderr."""

    def go(*argv: str) -> tuple[int, str, str]:
        rc = cli.main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return go


def problem(mask: str = "full", seqlen_q: int = 64, seqlen_k: int = 48) -> Problem:
    return Problem(2, 2, 2, seqlen_q, seqlen_k, 128, mask, 16, 16)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "atomic"])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_schedule_json(run, name: str, mask: str) -> None:
    rc, out, _ = run("schedule", "--name", name, "--mask", mask, *SHAPE, "--json")
    assert rc == 0
    envelope = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert envelope["command"] == "schedule" and envelope["exit_code"] == 0
    doc = envelope["result"]
    assert set(doc) == {"name", "num_workers", "chains", "dq_order", "fingerprint"}
    s = build_schedule(problem(mask), name, 3)
    assert doc["fingerprint"] == s.fingerprint()
    # chains in each worker's run order: [w, b, h, j, [i...]]
    assert doc["chains"] == [[w, c.b, c.h, c.j, list(c.visits)] for w, c in s.chains()]
    assert [row[0] for row in doc["chains"]] == sorted(row[0] for row in doc["chains"])
    # every dQ tile once: [b, h, i, [j...]]
    p = s.problem
    assert len(doc["dq_order"]) == p.batch * p.heads * p.n_q
    for b, h, i, order in doc["dq_order"]:
        assert order == list(s.dq_order(b, h, i))
        assert sorted(order) == list(p.tile_cols[i])
    # the visits in "chains" cover exactly the partials named in "dq_order"
    visited = sorted((b, h, i, j) for _, b, h, j, rows in doc["chains"] for i in rows)
    ordered = sorted((b, h, i, j) for b, h, i, order in doc["dq_order"] for j in order)
    assert visited == ordered


def test_schedule_json_atomic_has_null_orders(run) -> None:
    rc, out, _ = run("schedule", "--name", "atomic", *SHAPE, "--json")
    doc = json.loads(out)["result"]
    assert rc == 0 and doc["fingerprint"] == "nondeterministic"
    assert doc["dq_order"] and all(row[3] is None for row in doc["dq_order"])
    assert all(len(row) == 5 for row in doc["chains"])


def test_schedule_text(run) -> None:
    rc, out, _ = run("schedule", "--name", "shift", *SHAPE)
    assert rc == 0
    s = build_schedule(problem(), "shift", 3)
    assert out.strip() == s.describe()


def test_schedule_defaults_and_gqa(run) -> None:
    rc, out, _ = run("schedule", "--name", "naive", "--heads", "4", "--heads-kv", "2",
                     "--seqlen-q", "256", "--workers", "2", "--json")
    assert rc == 0
    s = build_schedule(Problem(1, 4, 2, 256, 256, 128, "full", 128, 128), "naive", 2)
    assert json.loads(out)["result"]["fingerprint"] == s.fingerprint()


def test_schedule_bad_shape_is_an_error(run) -> None:
    rc, out, err = run("schedule", "--heads", "3", "--heads-kv", "2", "--json")
    assert rc == 2 and "multiple of Problem.heads_kv" in err and len(err.splitlines()) == 1
    assert json.loads(out)["exit_code"] == 2 and "error" in json.loads(out)


def test_simulate_json_closed_forms(run) -> None:
    # n = 4 tiles = 4 workers, m = 3 heads, c = 2, r = 1 (docs/design.md section 4)
    n, m, c, r = 4, 3, 2.0, 1.0
    rc, out, _ = run("simulate", "--mask", "full", "--seqlen-q", str(16 * n), "--block-m", "16",
                     "--block-n", "16", "--heads", str(m), "--workers", str(n),
                     "--cost-compute", str(c), "--cost-reduce", str(r), "--json")
    assert rc == 0
    doc = json.loads(out)["result"]
    assert set(doc) == set(NAMES)
    for v in doc.values():
        assert set(v) == {"makespan", "critical_path", "idle_fraction"}
        assert v["critical_path"] == v["makespan"]  # two methods, one model
        assert 0.0 <= v["idle_fraction"] <= 1.0
    assert doc["naive"]["makespan"] == m * n * (c + r) + (n - 1) * r
    assert doc["shift"]["makespan"] == m * n * (c + r)
    assert doc["shift"]["idle_fraction"] == 0.0
    # every naive worker is busy m n (c + r), so each idles (n - 1) r of the makespan
    assert doc["naive"]["idle_fraction"] == pytest.approx((n - 1) * r / doc["naive"]["makespan"])


def test_simulate_one_name_causal_async_partial(run) -> None:
    n, m = 4, 2
    args = ["simulate", "--name", "symmetric_shift", "--mask", "causal",
            "--seqlen-q", str(16 * n), "--block-m", "16", "--block-n", "16", "--heads", str(m),
            "--workers", str(n), "--cost-compute", "1", "--cost-reduce", "0.5", "--json"]
    rc, out, _ = run(*args)
    doc = json.loads(out)["result"]
    assert list(doc) == ["symmetric_shift"]
    assert doc["symmetric_shift"]["makespan"] == m * (n + 1) * 1.5 / 2
    rc, out, _ = run(*args, "--partial")
    assert json.loads(out)["result"]["symmetric_shift"]["makespan"] < m * (n + 1) * 1.5 / 2
    rc, out, _ = run(*args, "--model", "async")
    assert json.loads(out)["result"]["symmetric_shift"]["makespan"] <= m * (n + 1) * 1.5 / 2
    # one staging buffer is the sync model
    rc, out, _ = run(*args, "--model", "async", "--staging", "1")
    assert json.loads(out)["result"]["symmetric_shift"]["makespan"] == m * (n + 1) * 1.5 / 2
    rc, _, err = run(*args, "--staging", "2")  # sync has no staging: usage error, one line
    assert rc == 2 and "staging" in err and len(err.strip().splitlines()) == 1


def test_simulate_text_and_timeline(run) -> None:
    rc, out, _ = run("simulate", "--mask", "causal", *SHAPE, "--timeline", "--width", "30")
    assert rc == 0
    for name in NAMES:
        assert any(line.startswith(name) for line in out.splitlines())
    bars = [line for line in out.splitlines() if line.startswith("w")]
    assert len(bars) == 3 * len(NAMES)
    assert all(len(line[line.index("|"):]) == 32 for line in bars)


def test_simulate_json_with_timeline_keeps_stdout_json(run) -> None:
    rc, out, err = run("simulate", *SHAPE, "--json", "--timeline")
    assert rc == 0 and set(json.loads(out)["result"]) == set(NAMES)
    assert "makespan" in err and "|" in err


def test_simulate_gantt(run, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "g.png"
    rc, _, _ = run("simulate", "--mask", "causal", *SHAPE, "--name", "all", "--gantt", str(png))
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_full_cli_registers_these_commands(capsys) -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == ["schedule", "simulate", "demo", "audit", "fuzz", "check",
                                 "capture", "reproduce"]
    assert cli.main(["schedule", "--name", "naive", "--seqlen-q", "256", "--json"]) == 0
    assert "fingerprint" in json.loads(capsys.readouterr().out)["result"]


def test_a_window_gives_the_schedule_of_the_windowed_problem(run) -> None:
    """``--window-size`` builds the windowed problem: the fingerprint is that of
    ``build_schedule`` on it, and differs from the causal problem's."""
    rc, out, _ = run("schedule", "--name", "banded", "--mask", "causal", "--window-size", "16",
                     "0", *SHAPE, "--json")
    assert rc == 0
    doc = json.loads(out)["result"]
    band = Problem(2, 2, 2, 64, 48, 128, "causal", 16, 16, window_size=(16, 0))
    assert doc["fingerprint"] == build_schedule(band, "banded", 3).fingerprint()
    assert doc["fingerprint"] != build_schedule(problem("causal"), "banded", 3).fingerprint()
    visited = {(b, h, i, j) for _, b, h, j, visits in doc["chains"] for i in visits}
    assert visited == {(b, h, i, j) for b in range(2) for h in range(2)
                       for i in range(band.n_q) for j in range(band.n_kv)
                       if band.active(i, j, b)}


def test_simulate_all_takes_banded_only_where_there_is_a_window(run) -> None:
    rc, out, _ = run("simulate", "--mask", "causal", "--window-size", "16", "0", *SHAPE,
                     "--json")
    assert rc == 0 and "banded" in json.loads(out)["result"]
    rc, out, _ = run("simulate", "--mask", "causal", *SHAPE, "--json")
    assert rc == 0 and "banded" not in json.loads(out)["result"]


@pytest.mark.parametrize("window", [["-3", "0"], ["4"], ["a", "0"]])
def test_a_bad_window_is_one_line_and_exit_2(run, window) -> None:
    rc, out, err = run("schedule", "--window-size", *window, *SHAPE)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "window" in err
