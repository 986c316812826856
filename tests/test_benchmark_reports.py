"""Report arithmetic of the GPU benchmark scripts, on made-up measurements: the ratios
``versus_fa4.py`` reports, how ``harness.py`` assigns Nsight Compute's kernels to the
workload's ranges (``ncu_summary.py``, ``ncu_hotspots.py``), and their refusals of bad
arguments."""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import determinism_report  # noqa: E402
import harness  # noqa: E402
import model_vs_measured  # noqa: E402
import ncu_summary  # noqa: E402
import versus_fa4  # noqa: E402


def _cell(rounds: int, rng: random.Random) -> dict:
    """A cell as ``versus_fa4.timed_rows`` measures it: FA4's backward not captured."""
    def times(mean: float) -> list[float]:
        return [mean * rng.uniform(0.95, 1.05) for _ in range(rounds)]

    means = {"cute:auto:bwd": 2.0, "cute:shift:bwd": 1.8, "cute:spt:bwd": 2.4,
             "cute:fwd": 1.0, "fa4:bwd": 1.7, "fa4-det:bwd": 1.9, "fa4:fwd": 0.9}
    return {"ms": {
        "graph": {row: times(m) for row, m in means.items() if not row.startswith("fa4-")
                  and row != "fa4:bwd"},
        "queued": {row: times(m * 1.01) for row, m in means.items()},
        "single": {row: times(m * 1.1) for row, m in means.items()}}}


def test_versus_fa4_ratios_are_taken_within_each_round_and_timing():
    """Each ratio within each round; the kernels' column from replays only where every row
    of the ratio was captured (else every row's back-to-back calls), the calls' column from
    the single calls."""
    rng = random.Random(7)
    cell = _cell(5, rng)
    graph, queued, single = (cell["ms"][t] for t in ("graph", "queued", "single"))
    out = versus_fa4.summarize(cell)
    assert out["best_schedule"] == "shift"  # lowest median kernel time
    per_round = [queued["fa4-det:bwd"][r] / queued["cute:shift:bwd"][r] for r in range(5)]
    stat = out["bwd_best_vs_fa4_det"]["kernels"]
    assert stat["timing"] == "queued"  # FA4's backward was not captured
    assert stat["median"] == pytest.approx(sorted(per_round)[2], abs=1e-4)
    assert stat["min"] == pytest.approx(min(per_round), abs=1e-4)
    assert stat["max"] == pytest.approx(max(per_round), abs=1e-4)
    fwd = [graph["fa4:fwd"][r] / graph["cute:fwd"][r] for r in range(5)]
    assert out["fwd_vs_fa4"]["kernels"]["timing"] == "graph"
    assert out["fwd_vs_fa4"]["kernels"]["median"] == pytest.approx(sorted(fwd)[2], abs=1e-4)
    steps = [(single["fa4:fwd"][r] + single["fa4-det:bwd"][r])
             / (single["cute:fwd"][r] + single["cute:shift:bwd"][r]) for r in range(5)]
    assert out["step_vs_fa4_det"]["calls"]["median"] == pytest.approx(sorted(steps)[2],
                                                                      abs=1e-4)
    auto = [single["fa4-det:bwd"][r] / single["cute:auto:bwd"][r] for r in range(5)]
    assert out["bwd_auto_vs_fa4_det"]["calls"]["median"] == pytest.approx(sorted(auto)[2],
                                                                          abs=1e-4)


def test_versus_fa4_table_has_a_row_per_cell():
    rng = random.Random(3)
    cells = []
    for s in (512, 1024):
        cell = _cell(3, rng)
        cell.update(d=64, mask="full", S=s, B=1, H=32)
        cell.update(versus_fa4.summarize(cell))
        cells.append(cell)
    env = {"command": "python benchmarks/versus_fa4.py", "gpu": "GPU", "torch": "2.x",
           "git_revision": "abcdef0", "date_utc": "today", "rounds": 3, "reps": 10}
    table = versus_fa4.markdown({"environment": env, "cells": cells})
    rows = [line for line in table.splitlines() if line.startswith("| 64 |")]
    assert len(rows) == 2 and "| shift |" in rows[0]
    assert "graph: forward" in table and "queued: backward, step" in table


def test_rotating_rounds_take_every_measure_once_a_round_in_a_rotating_order():
    seen = []
    measures = {key: (lambda key=key: seen.append(key) or len(seen)) for key in "abc"}
    out = harness.rotating_rounds(measures, 3)
    assert seen == list("abc" "bca" "cab")
    assert out == {"a": [1, 6, 8], "b": [2, 4, 9], "c": [3, 5, 7]}


def test_versus_fa4_refuses_bad_arguments(capsys):
    assert versus_fa4.main(["--rounds", "0"]) == 2
    assert "--rounds" in capsys.readouterr().err


def test_determinism_report_refuses_an_unknown_mask_before_looking_for_a_gpu(capsys):
    assert determinism_report.main(["--long-masks", "full,sliding"]) == 2
    assert "--long-masks" in capsys.readouterr().err


@pytest.mark.parametrize("dims", ["96x", "64,0", "4096", ""])
def test_determinism_report_refuses_a_bad_head_dim_before_looking_for_a_gpu(capsys, dims):
    assert determinism_report.main(["--long-head-dims", dims]) == 2
    err = capsys.readouterr().err
    assert "--long-head-dims" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("cells", ["heavy", "heavy:16384,lumpy:100", "uniform:many"])
def test_determinism_report_refuses_bad_packed_cells_before_looking_for_a_gpu(capsys, cells):
    assert determinism_report.main(["--long-packed", cells]) == 2
    err = capsys.readouterr().err
    assert "--long-packed" in err and len(err.strip().splitlines()) == 1


def test_a_packed_row_reads_as_its_tokens_and_sequences():
    p = determinism_report.packed_problem("equal", 8192)  # four sequences of 2048
    assert (p.batch, p.total_q, p.head_dim, p.mask) == (4, 8192, 128, "causal")
    row = {"impl": "dash-cute:lpt", "problem": p.__dict__, "trials": 1000, "error": "x"}
    assert "| 8192 packed (4 seqs) | causal |" in determinism_report.markdown(
        [row], {"gpu": "GPU", "command": "c", "git": "g", "torch": "t", "triton": "t",
                "date": "d"})


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is present")
def test_gpu_benchmarks_refuse_to_run_without_a_cuda_device(capsys):
    assert harness.no_cuda("versus_fa4") is True
    assert capsys.readouterr().err == "versus_fa4: needs a CUDA device\n"
    assert versus_fa4.main(["--rounds", "1"]) == 2
    assert "versus_fa4: needs a CUDA device" in capsys.readouterr().err


def _write_raw(path: Path, kernels: list[tuple[str, float, float]]) -> None:
    metric = "smsp__issue_active.avg.pct_of_peak_sustained_active"
    stall = "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["ID", "Kernel Name", "gpu__time_duration.sum", metric, stall])
        w.writerow(["", "", "ms", "%", "ratio"])
        for n, (name, ms, issue) in enumerate(kernels):
            w.writerow([n, name, ms, issue, issue / 100])


def test_ncu_summary_takes_each_ranges_longest_kernel(tmp_path):
    rng = random.Random(11)
    big = [rng.uniform(1.0, 3.0) for _ in range(2)]
    _write_raw(tmp_path / "raw.csv", [
        ("spin_kernel", 0.002, 1.0), ("prep", 0.03, 10.0), ("attn_a", big[0], 55.0),
        ("post", 0.04, 12.0), ("spin_kernel", 0.002, 1.0), ("attn_b", big[1], 44.0)])
    ranges = [{"d": 64, "mask": "full", "S": 4096, "impl": "a", "pass": "bwd"},
              {"d": 64, "mask": "full", "S": 4096, "impl": "b", "pass": "fwd"}]
    (tmp_path / "ranges.json").write_text(json.dumps(ranges))
    rows = ncu_summary.summarize(tmp_path)["rows"]
    assert [r["kernel"] for r in rows] == ["attn_a", "attn_b"]
    assert rows[0]["time us"] == pytest.approx(big[0] * 1e3)
    assert rows[0]["range_us"] == pytest.approx((0.03 + big[0] + 0.04) * 1e3)
    assert rows[1]["issue %"] == 44.0 and rows[0]["stalls"] == {"barrier": 0.55}


def test_ncu_summary_refuses_mismatched_ranges(tmp_path, capsys):
    _write_raw(tmp_path / "raw.csv", [("spin_kernel", 0.002, 1.0), ("attn", 1.0, 50.0)])
    (tmp_path / "ranges.json").write_text(json.dumps([{}, {}]))
    assert ncu_summary.main([str(tmp_path)]) == 2
    assert "ranges" in capsys.readouterr().err


def test_forward_grid_lists_every_option_once_tile_heights_vary():
    import forward_grid

    rng = random.Random(5)
    names = [f"m{m} {o}" for m in (128, 192) for o in forward_grid.OPTIONS]
    speeds = {n: round(rng.uniform(300, 500), 1) for n in names}
    report = {"command": "c", "git_revision": "r", "rows": [
        {"d": 64, "mask": "causal", "S": 2048, "tflops": speeds, "rule": names[4],
         "bits_equal": True}]}
    lines = [x for x in forward_grid.markdown(report).splitlines() if x.startswith("| 64 |")]
    assert len(lines) == len(names)
    best = max(speeds, key=speeds.get)
    assert lines[0].split(" | ")[3] == best and "| 1.000 |" in lines[0]
    assert sum(" | yes | yes |" in x for x in lines) == 1  # the rule's line only


def _write_source(path: Path, sections: list[tuple[str, list[tuple[str, int, int]]]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        for name, rows in sections:
            w.writerow(["Kernel Name", name])
            w.writerow(["Address", "Source", "Warp Stall Sampling (All Samples)",
                        "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed"])
            for n, (sass, samples, executed) in enumerate(rows):
                w.writerow([hex(n * 16), f"      {sass}", samples, samples // 2, executed])


def test_ncu_hotspots_shares_the_main_kernels_samples_by_opcode(tmp_path):
    import ncu_hotspots

    rng = random.Random(13)
    mufu, sts, bra = (rng.randint(50, 500) for _ in range(3))
    _write_source(tmp_path / "source.csv", [
        ("spin_kernel", [("EXIT ;", 1, 1)]),
        ("prep", [("LDG.E R2, desc[UR4][R2.64] ;", 3, 10)]),
        ("attn", [("MUFU.EX2 R4, R4 ;", mufu, 64), ("@!P0 BRA 0x10 ;", bra, 8),
                  ("STS [R2], R4 ;", sts, 32), ("STS [R3], R5 ;", 0, 32),
                  ("NOP ;", 0, 0)]),
    ])
    (tmp_path / "ranges.json").write_text(json.dumps(
        [{"d": 64, "mask": "full", "S": 1024, "impl": "x", "pass": "bwd"}]))
    (row,) = ncu_hotspots.hotspots(tmp_path)["rows"]
    total = mufu + sts + bra
    assert row["kernel"] == "attn" and row["samples"] == total
    assert row["share"]["MUFU.EX2"] == pytest.approx(100 * mufu / total, abs=0.01)
    assert row["share"]["BRA"] == pytest.approx(100 * bra / total, abs=0.01)
    assert row["code"] == {"MUFU.EX2": 1, "BRA": 1, "STS": 2}  # NOP never executed
    table = ncu_hotspots.markdown({"rows": [row]})
    assert "| 2 / 0 / 0 / 1 |" in table


def test_versus_fa4_refuses_a_group_that_does_not_divide_the_heads(capsys):
    """``--group`` must divide every head count of the grid (32 at d = 64, 16 at d = 128)."""
    assert versus_fa4.main(["--group", "3"]) == 2
    assert "--group" in capsys.readouterr().err
    assert versus_fa4.main(["--group", "0"]) == 2


def test_every_grid_tool_refuses_a_group_that_does_not_divide_the_heads(capsys):
    """The grid has 32 heads at d = 64 and 16 at d = 128: a group of 3 or 0 is refused with
    exit 2 and one line, before any GPU is looked for, by each tool that takes ``--group``."""
    import ab_backward
    import profile_backward

    assert harness.group_error(4, (64, 128)) is None
    assert harness.group_error(32, (64,)) is None
    assert harness.group_error(32, (64, 128)) is not None
    for bad in ("3", "0"):
        assert ab_backward.main(["--group", bad, "--base", "x=/tmp"]) == 2
        assert profile_backward.main(["--out", "/tmp/unused", "--group", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and all("--group" in line for line in err)


@pytest.mark.parametrize("argv, says", [
    (["--backend", "cute"], "--rho"),  # the async model needs r / c from the probe
    (["--rho", "64x"], "D=VALUE"),
])
def test_model_vs_measured_refuses_what_it_cannot_fit(capsys, argv, says):
    grid = "benchmarks/results/bench_attention.json"
    assert model_vs_measured.main([grid, *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_training_profile_table_gives_each_attention_its_step_against_ours():
    import training_profile

    def result(wall, least, kernels):
        return {"wall_ms": wall, "least_wall_ms": least, "kernels": kernels,
                "attention_forward": 0.9, "attention_backward": 2.3}

    report = {"command": "python benchmarks/training_profile.py", "git_revision": "abc1234",
              "gpu": "GPU", "preset": "small", "warmup": 8, "steps": 10, "rounds": 6,
              "config": {"layers": 6, "d_model": 768, "heads": 12, "seqlen": 2048,
                         "batch": 8},
              "results": {"dash": result(28.0, 23.0, 22.0),
                          "sdpa-cudnn": result(30.8, 24.15, 23.0)}}
    rows = {line.split(" | ")[0]: line for line in
            training_profile.markdown(report).splitlines() if line.startswith("| ")}
    assert rows["| dash"].endswith("| 6.00 | 1.000 | 1.000 |")  # idle: wall - kernels
    assert rows["| sdpa-cudnn"].endswith("| 7.80 | 1.100 | 1.050 |")


def test_training_profile_needs_a_gpu(capsys, monkeypatch):
    import torch
    import training_profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert training_profile.main(["--out", "/nonexistent"]) == 2
    assert "training_profile: needs a CUDA device" in capsys.readouterr().err


def test_versus_fa4_times_every_row_three_ways_and_reports_both_columns(monkeypatch):
    """A whole (mocked) run of ``versus_fa4``: every row timed as single calls and
    back-to-back calls in every round, as replays where it captures (FA4's backward does
    not), and each cell's ratios in both columns."""
    import argparse
    from types import SimpleNamespace

    import torch

    timed = []

    def fake_rows(*args, **kwargs):  # (fwd, bwd) closures that name their row
        return ("fwd", "bwd")

    def fa4_rows(fa, det, *args):
        name = "fa4-det" if det else "fa4"
        return (f"{name}:fwd", f"{name}:bwd")

    def replayable(fn, warmup):
        return (f"replay:{fn}", "eager" if fn == "fa4-det:bwd" or fn == "fa4:bwd"
                else "graph")

    def measure(kind):
        def ms(run, reps):
            timed.append((kind, run))
            return 1.0 + 0.01 * len(timed)
        return ms

    monkeypatch.setattr(versus_fa4, "load_fa4", lambda: object())
    monkeypatch.setattr(versus_fa4, "environment", lambda args: {"reps": args.reps})
    monkeypatch.setattr(versus_fa4, "grid_inputs", lambda d, s, gen, group: (None,) * 4)
    monkeypatch.setattr(versus_fa4, "dash_autograd_closures", fake_rows)
    monkeypatch.setattr(versus_fa4, "fa4_closures", fa4_rows)
    monkeypatch.setattr(versus_fa4, "replayable", replayable)
    monkeypatch.setattr(versus_fa4, "median_ms", measure("events"))
    monkeypatch.setattr(versus_fa4, "single_call_ms", measure("single"))
    monkeypatch.setattr(torch, "Generator", lambda device=None: SimpleNamespace(
        manual_seed=lambda seed: None))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    args = argparse.Namespace(head_dims=[64], masks=["causal"], seqlens=[1024], schedules=1,
                              rounds=2, reps=3, warmup=1, workers=None, group=1,
                              time_budget=float("inf"), argv=[])
    report = versus_fa4.run(args)
    (cell,) = report["cells"]
    assert set(cell["ms"]["single"]) == set(cell["ms"]["queued"]) == {
        "cute:auto:bwd", "cute:symmetric_shift:bwd", "cute:fwd", "fa4:bwd", "fa4:fwd",
        "fa4-det:bwd"}
    assert set(cell["ms"]["graph"]) == {"cute:auto:bwd", "cute:symmetric_shift:bwd",
                                        "cute:fwd", "fa4:fwd"}
    assert all(len(t) == 2 for timing in cell["ms"].values() for t in timing.values())
    assert len(timed) == 2 * (6 + 6 + 4)  # two rounds of every row in every timing
    assert cell["fwd_vs_fa4"]["kernels"]["timing"] == "graph"
    assert cell["bwd_best_vs_fa4_det"]["kernels"]["timing"] == "queued"
    report["environment"].update(command="c", gpu="g", torch="t", git_revision="r",
                                 date_utc="d", rounds=2)
    assert "| 64 | causal | 1024 |" in versus_fa4.markdown(report)


def test_bench_features_reports_a_training_step_column_and_old_reports_without_it():
    """The step column is FA4-det's step time over ours, round by round (3.3 / 3.0 and
    3.6 / 4.0: median 1.00, range 0.90 - 1.10); a report from before steps were timed
    says ``-`` there."""
    import bench_features

    times = {"backward": {"cute:auto": [2.0, 2.2], "cute:naive": [6.0, 6.0],
                          "fa4-det": [2.2, 2.2], "fa4": [2.0, 2.0]},
             "forward": {"cute:auto": [1.0, 1.0], "fa4": [0.9, 1.1]},
             "step": {"cute:auto": [3.0, 4.0], "fa4-det": [3.3, 3.6]}}
    cell = {"kind": "sinks", "seqlen": 4096, "batch": 4, "ms": times,
            "median_ms": {part: {r: sum(t) / len(t) for r, t in ms.items()}
                          for part, ms in times.items()}}
    report = {"command": "x", "git_revision": "abc", "cells": [cell],
              "environment": {"gpu": "H200", "torch": "2.11", "triton": "3.6", "reps": 10}}
    row = next(x for x in bench_features.markdown(report).splitlines()
               if x.startswith("| sinks"))
    assert row.endswith("| 1.00 (0.90 - 1.10) |") and "step: fa4-det / ours" in \
        bench_features.markdown(report)
    del cell["ms"]["step"]
    row = next(x for x in bench_features.markdown(report).splitlines()
               if x.startswith("| sinks"))
    assert row.endswith("| - |")
