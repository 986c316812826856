"""The rows ``bench_features.py`` times, cell by cell, on stand-ins for the kernels.

Each cell gets ``dash_cuda`` rows on every backend whose limits admit its call
(``dash_cuda.backends.limit``: the same answer as the calls themselves), with the
schedules the cell compares, and FlashAttention-4 with and without ``deterministic=True``;
every row calls with the cell's options and runs on leaves of its own. Here
``dash_cuda``'s entry points and FlashAttention-4 are recording stand-ins on the CPU, so
what is checked is what each row would call.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_features  # noqa: E402

import dash_cuda  # noqa: E402


class Recorder:
    """Stand-ins that record each call's keywords and leaves and return an output that
    depends on every input (so ``torch.autograd.grad`` reaches all of them)."""

    def __init__(self):
        self.calls: list[tuple[str, dict, tuple[int, ...]]] = []

    def stand_in(self, who: str):
        def call(q, k, v, *offsets, **kw):
            tensors = [q, k, v] + [x for x in kw.values() if isinstance(x, torch.Tensor)
                                   and x.requires_grad]
            self.calls.append((who, {n: x for n, x in kw.items()
                                     if not isinstance(x, torch.Tensor)},
                               tuple(id(x) for x in tensors)))
            return v * 1 + sum(x.sum() for x in tensors) * 0
        return call


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(bench_features, "DEVICE", "cpu")
    monkeypatch.setattr(dash_cuda, "attention", r.stand_in("dash"))
    monkeypatch.setattr(dash_cuda, "attention_varlen", r.stand_in("dash-varlen"))
    monkeypatch.setattr(bench_features, "_fa4_varlen",
                        lambda: (r.stand_in("fa4"), r.stand_in("fa4-varlen")))
    return r


def _rows(kind: str, **match):
    """The first cell of ``kind`` whose entries equal ``match``, and its rows."""
    cell = next(c for c in bench_features.cells([kind])
                if all(c.get(n) == x for n, x in match.items()))
    gen = torch.Generator().manual_seed(0)
    return cell, bench_features.closures(cell, gen)


def _shrunk(monkeypatch):
    # small cells: the stand-ins only look at the calls
    monkeypatch.setattr(bench_features, "VARLEN", [(512, "heavy")])
    monkeypatch.setattr(bench_features, "WINDOWS", [(256, 64)])
    monkeypatch.setattr(bench_features, "HEAD_DIM_CELLS",
                        [(192, 128, True, 64, 1, 2, 0.0), (256, 256, True, 64, 1, 2, 50.0)])
    monkeypatch.setattr(bench_features, "HEAD_DIM_GRID", [(96, 96, 2)])
    monkeypatch.setattr(bench_features, "HEAD_DIM_LENGTHS", (64,))
    monkeypatch.setattr(bench_features, "SINKS", [64])


def _distinct_leaves(rec: Recorder) -> None:
    # one call per row (a row's forward runs once as it is built), each on its own leaves
    assert len({ids[0] for _, _, ids in rec.calls}) == len(rec.calls)


def test_a_packed_cell_times_each_backends_schedules_and_fa4_varlen(rec, monkeypatch):
    _shrunk(monkeypatch)
    cell, rows = _rows("varlen")
    assert list(rows) == ["cute:auto", "cute:lpt", "cute:naive", "triton:auto",
                          "triton:lpt", "triton:naive", "fa4-det", "fa4"]
    assert all(len(r) == 3 for r in rows.values())  # forward, backward, step
    dash = [kw for who, kw, _ in rec.calls if who == "dash-varlen"]
    assert [(kw["backend"], kw["schedule"]) for kw in dash] == [
        (r.partition(":")[0], r.partition(":")[2]) for r in rows if ":" in r]
    assert all(kw["causal"] for kw in dash)
    fa = [kw for who, kw, _ in rec.calls if who == "fa4-varlen"]
    assert [kw["deterministic"] for kw in fa] == [True, False]
    assert {kw["max_seqlen_q"] for kw in fa} == {cell["longest"]}
    _distinct_leaves(rec)


def test_a_window_cell_passes_the_window_to_every_row(rec, monkeypatch):
    _shrunk(monkeypatch)
    _, rows = _rows("window")
    assert [r for r in rows if r.startswith("cute")] == ["cute:auto", "cute:banded",
                                                         "cute:naive"]
    assert {kw["window_size"] for who, kw, _ in rec.calls if who == "dash"} == {(64, 0)}
    assert {kw["window_size"] for who, kw, _ in rec.calls if who == "fa4"} == {(64, None)}


@pytest.mark.parametrize("kind", ["sinks", "softcap"])
def test_a_feature_cell_times_it_with_and_without_the_feature(rec, monkeypatch, kind):
    _shrunk(monkeypatch)
    cell, rows = _rows(kind)
    without = "nosink" if kind == "sinks" else "nocap"
    assert list(rows) == ["cute:auto", "cute:naive", "triton:auto", "triton:naive",
                          f"cute-{without}", f"triton-{without}", "fa4-det", "fa4"]
    dash = [(kw, ids) for who, kw, ids in rec.calls if who == "dash"]
    with_feature = [(kw, ids) for kw, ids in dash if "schedule" in kw]
    plain = [(kw, ids) for kw, ids in dash if "schedule" not in kw]
    assert len(with_feature) == 4 and len(plain) == 2
    if kind == "sinks":  # the logits are a fourth leaf of the rows with sinks
        assert all(len(ids) == 4 for _, ids in with_feature)
        assert all(len(ids) == 3 for _, ids in plain)
    else:
        assert all(kw["softcap"] == cell["softcap"] for kw, _ in with_feature)
        assert all("softcap" not in kw for kw, _ in plain)
    _distinct_leaves(rec)


def test_a_head_dim_cell_runs_on_the_backends_that_take_it(rec, monkeypatch):
    _shrunk(monkeypatch)
    # 192 / 128 and 256: both backends (CuTe's head-dim split first)
    _, rows = _rows("headdims", head_dim=192)
    assert list(rows) == ["cute:auto", "triton:auto", "fa4-det", "fa4"]
    rec.calls.clear()
    _, rows = _rows("headdims", head_dim=256)
    assert list(rows) == ["cute:auto", "triton:auto", "fa4-det", "fa4"]
    assert {kw["softcap"] for _, kw, _ in rec.calls} == {50.0}
    _, rows = _rows("headdims-grid", head_dim=96)
    assert list(rows) == ["cute:auto", "triton:auto", "fa4-det", "fa4"]


def test_a_head_dim_cells_schedules_run_on_the_backend_auto_takes(rec, monkeypatch):
    _shrunk(monkeypatch)
    cell = next(c for c in bench_features.cells(["headdims-grid"]))
    rows = bench_features.closures(cell, torch.Generator().manual_seed(0),
                                   ("spt", "interleaved"))
    assert list(rows) == ["cute:auto", "triton:auto", "cute:spt", "cute:interleaved",
                          "fa4-det", "fa4"]
    dash = [kw for who, kw, _ in rec.calls if who == "dash"]
    assert [(kw["backend"], kw["schedule"]) for kw in dash] == [
        ("cute", "auto"), ("triton", "auto"), ("cute", "spt"), ("cute", "interleaved")]
    _distinct_leaves(rec)


def test_head_dims_narrow_the_head_dim_cells_only():
    every = bench_features.cells(["varlen", "headdims-grid"])
    narrowed = bench_features.cells(["varlen", "headdims-grid"], head_dims=[96])
    grid = [c for c in narrowed if c["kind"] == "headdims"]
    assert {c["head_dim"] for c in grid} == {96}
    assert [c["seqlen"] for c in grid] == list(bench_features.HEAD_DIM_LENGTHS)
    assert [c for c in narrowed if c["kind"] == "varlen"] == [
        c for c in every if c["kind"] == "varlen"]
