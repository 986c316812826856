"""``schedule="auto"``: a measured table, regenerated from the committed benchmark."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from dash_ref import DETERMINISTIC, Problem, build_schedule
from dash_ref.schedules import auto
from dash_ref.schedules.auto import TABLE, auto_schedule, load_table, paper_advice

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from make_auto_table import make_table  # noqa: E402


def test_table_is_what_the_committed_benchmark_says():
    report = json.loads((ROOT / "benchmarks/results/bench_attention.json").read_text())
    committed = json.loads(TABLE.read_text())
    again = make_table(report, committed["tie"], committed["source"])
    assert again == committed


def test_a_head_dim_report_adds_the_entries_of_its_head_dims(monkeypatch):
    """A ``bench_features.py --schedules`` report's head-dim cells become entries of their
    own head dim (TFLOP/s from the median backward times; ``auto`` and the peers' rows
    are no schedules), and ``auto`` then takes them at that head dim alone."""
    report = json.loads((ROOT / "benchmarks/results/bench_attention.json").read_text())
    cell = {"kind": "headdims", "head_dim": 256, "head_dim_v": 256, "causal": True,
            "seqlen": 1024, "batch": 16, "heads": 8, "softcap": 0.0,
            "median_ms": {"backward": {"cute:auto": 1.0, "triton:auto": 2.5, "cute:spt": 1.0,
                                       "cute:interleaved": 0.9, "fa4": 0.8}}}
    features = {"git_revision": "abc1234", "cells": [
        cell, {"kind": "varlen", "median_ms": {"backward": {"cute:lpt": 1.0}}}]}
    table = make_table(report, 0.01, "grid.json", features, "features.json")
    assert table["head_dims_source"] == "features.json"
    assert table["head_dims_git_revision"] == "abc1234"
    plain = make_table(report, 0.01, "grid.json")
    added = [e for e in table["entries"] if e not in plain["entries"]]

    def tflops(ms: float) -> float:  # 2.5 x 4 B H S^2 d, halved (causal), in ms
        return round(2.5 * 4 * 16 * 8 * 1024 ** 2 * 256 / 2 / (ms * 1e-3) / 1e12, 1)

    assert added == [{"backend": "cute", "mask": "causal", "head_dim": 256, "seqlen": 1024,
                      "schedule": "interleaved", "bwd_tflops": tflops(0.9),
                      "all_tflops": {"interleaved": tflops(0.9), "spt": tflops(1.0)}}]
    d128 = next(e["schedule"] for e in plain["entries"]
                if (e["backend"], e["mask"], e["head_dim"], e["seqlen"])
                == ("cute", "causal", 128, 1024))
    assert auto_schedule("causal", 256, 1024, "cute") == d128  # the committed table
    monkeypatch.setattr(auto, "load_table", lambda: tuple(table["entries"]))
    assert auto_schedule("causal", 256, 1024, "cute") == "interleaved"
    assert auto_schedule("causal", 128, 1024, "cute") == d128


def test_every_entry_is_a_deterministic_schedule_within_the_tie_of_the_best():
    table = json.loads(TABLE.read_text())
    for e in table["entries"]:
        assert e["schedule"] in DETERMINISTIC
        assert e["bwd_tflops"] >= max(e["all_tflops"].values()) * (1 - table["tie"])


def test_auto_resolves_through_the_table_for_every_grid_cell():
    first = load_table()[0]["backend"]
    for e in load_table():
        p = Problem(1, 1, 1, e["seqlen"], e["seqlen"], e["head_dim"], e["mask"])
        assert auto_schedule(e["mask"], e["head_dim"], e["seqlen"], e["backend"]) == \
            e["schedule"]
        if e["backend"] == first:  # without a backend: the first one the table lists
            assert build_schedule(p, "auto", 8).name == e["schedule"]


def test_lookup_takes_the_nearest_head_dim_then_length_in_log2():
    entries = load_table()

    def entry(mask: str, d: int, s: int) -> str:
        return next(e["schedule"] for e in entries
                    if (e["mask"], e["head_dim"], e["seqlen"]) == (mask, d, s))

    assert auto_schedule("causal", 16, 700) == entry("causal", 64, 512)  # 700: log2 nearer 512
    assert math.log2(3000) - 11 > 12 - math.log2(3000)
    assert auto_schedule("full", 256, 3000) == entry("full", 128, 4096)
    assert auto_schedule("full", 64, 1 << 20) == entry("full", 64, 16384)


def test_without_a_table_the_papers_advice_applies(monkeypatch):
    monkeypatch.setattr(auto, "load_table", lambda: ())
    assert auto_schedule("full", 64, 1024) == "shift" == paper_advice("full", 64)
    assert auto_schedule("causal", 128, 1024) == "descending"
    assert auto_schedule("causal", 64, 1024) == "symmetric_shift"


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_auto_has_the_fingerprint_of_what_it_resolves_to(mask):
    p = Problem(1, 2, 2, 256, 256, 64, mask, 64, 64)
    resolved = auto_schedule(mask, 64, 256)
    assert build_schedule(p, "auto", 4).fingerprint() == \
        build_schedule(p, resolved, 4).fingerprint()


def test_auto_takes_banded_for_windows_where_the_committed_measurement_says_so():
    """On the backend of ``WINDOWS_MEASURED_ON`` a windowed problem resolves to ``banded``;
    the committed H200 measurement has ``banded`` at least 0.98 of the table's choice's
    speed on every window cell of that backend, and ahead on the windows of 1024 and more;
    on the other backend, slower, the table still decides; without a window nothing
    changes."""
    from dash_ref import resolve_name
    from dash_ref.schedules.schedule import WINDOWS_MEASURED_ON

    band = Problem(1, 16, 16, 8192, 8192, 128, "causal", 64, 128, window_size=(1024, 0))
    plain = Problem(1, 16, 16, 8192, 8192, 128, "causal", 64, 128)
    assert resolve_name("auto", band, WINDOWS_MEASURED_ON) == "banded"
    assert resolve_name("auto", band, WINDOWS_MEASURED_ON, portable=True) == "banded"
    assert resolve_name("auto", plain, WINDOWS_MEASURED_ON) != "banded"
    assert resolve_name("auto", band, "triton") == resolve_name("auto", plain, "triton")
    # the measurement that decided it, before `auto` took `banded` (since then a window's
    # `cute:auto` row is `banded` itself)
    report = json.loads((ROOT / "benchmarks/results/experiments/windows_auto_a07479d.json")
                        .read_text())
    windows = [c for c in report["cells"] if c["kind"] == "window"]
    assert windows
    for cell in windows:
        bwd = cell["median_ms"]["backward"]
        speed = {b: bwd[f"{b}:auto"] / bwd[f"{b}:banded"] for b in ("cute", "triton")}
        assert speed[WINDOWS_MEASURED_ON] >= 0.98, cell["window"]
        if cell["window"] >= 1024:
            assert speed[WINDOWS_MEASURED_ON] > 1.0, cell["window"]
        assert speed["triton"] < 1.0  # why Triton keeps the table


def test_auto_takes_lpt_for_ragged_packed_batches_where_the_committed_measurement_says_so():
    """On the backend of ``RAGGED_MEASURED_ON`` a packed batch whose longest sequence is more
    than ``RAGGED_SPREAD`` times the mean length resolves to ``lpt``, any other to the
    table's choice; in the committed H200 measurement that pick is the faster of the two
    (grouped ``lpt``, ``lpt_f4``, against ``auto`` before this rule) on every packed batch;
    on the other backend, and on rectangular problems, the table decides."""
    from model_varlen import lengths

    from dash_ref import resolve_name
    from dash_ref.schedules.schedule import GROUP_FILL, RAGGED_MEASURED_ON, is_ragged

    assert GROUP_FILL == 4  # the fill the measurement's lpt_f4 rows ran
    report = json.loads((ROOT / "benchmarks/results/experiments/head_groups.json")
                        .read_text())
    seen = set()
    for run in report["runs"]:
        for cell in run:
            kind, total, mix = cell["cell"]
            if kind != "varlen":
                continue
            seqlens = lengths(mix, total)
            p = Problem.packed(seqlens, seqlens, 16, 16, 128, "causal", 64, 128)
            alone = Problem(1, 16, 16, max(seqlens), max(seqlens), 128, "causal", 64, 128)
            assert resolve_name("auto", p, "triton") == resolve_name("auto", alone, "triton")
            table = resolve_name("auto", alone, RAGGED_MEASURED_ON)
            picked = resolve_name("auto", p, RAGGED_MEASURED_ON)
            assert picked == ("lpt" if is_ragged(p) else table)
            ms = cell["median_ms"]
            faster = "lpt" if ms["lpt_f4"] < ms["auto"] else table
            assert picked == faster, (mix, total)
            seen.add((mix, is_ragged(p)))
    assert seen == {("equal", False), ("uniform", False), ("heavy", True)}
    assert not is_ragged(Problem(2, 4, 4, 300, 300, 64, "causal", 64, 64))
    assert not is_ragged(Problem.packed((0, 0), (0, 0), 2, 2, 64, "causal", 64, 64))
