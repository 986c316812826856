"""Schedules reach a kernel only as validated tables: ``dash_cuda.tables`` refuses a broken
schedule before anything is uploaded or launched (on the CPU here; the tables are plain
int32 tensors on whatever device they are asked for)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dash_cuda.tables as tables
from dash_ref import Chain, Problem, ScheduleError, build_schedule

PROBLEM = Problem(1, 2, 2, 256, 256, 64, "full")  # 2 heads, 2 x 2 tiles


def drop_last_visit(schedule):
    """The schedule with one visit missing: its tile's dQ would lack a partial."""
    workers = [list(w) for w in schedule.workers]
    c = workers[0][0]
    workers[0][0] = Chain(c.b, c.h, c.j, c.visits[:-1])
    return dataclasses.replace(schedule, workers=tuple(tuple(w) for w in workers))


@pytest.fixture(autouse=True)
def fresh_cache():
    tables.clear_cache()
    yield
    tables.clear_cache()


def test_valid_tables_are_what_the_schedule_says():
    entry = tables.device_schedule(PROBLEM, "shift", 3, torch.device("cpu"))
    want = build_schedule(PROBLEM, "shift", 3).to_tables().as_dict()
    assert entry.fingerprint == build_schedule(PROBLEM, "shift", 3).fingerprint()
    for name in tables.TABLE_NAMES:
        assert torch.equal(entry.tables[name], torch.from_numpy(want[name]).to(torch.int32))


def test_a_broken_schedule_is_refused_before_upload(monkeypatch):
    broken = drop_last_visit(build_schedule(PROBLEM, "naive", 3))
    monkeypatch.setattr(tables, "build_schedule", lambda problem, name, workers: broken)
    uploads = []
    monkeypatch.setattr(torch, "from_numpy", lambda a: uploads.append(a) or a)
    with pytest.raises(ScheduleError, match="never"):
        tables.device_schedule(PROBLEM, "naive", 3, torch.device("cpu"))
    assert uploads == []
    monkeypatch.undo()
    # nothing of the refused schedule was cached: the real one builds afterwards
    real = build_schedule(PROBLEM, "naive", 3)
    entry = tables.device_schedule(PROBLEM, "naive", 3, torch.device("cpu"))
    assert entry.num_visits == sum(len(c.visits) for w in real.workers for c in w)
    assert entry.num_visits == sum(len(c.visits) for w in broken.workers for c in w) + 1
