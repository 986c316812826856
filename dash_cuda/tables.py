"""Schedules on the device: build, validate and upload the int32 tables once per shape.

The kernel reads :meth:`dash_ref.Schedule.to_tables` as they are; nothing about a schedule
is re-derived on the GPU. Building and validating a schedule is host work proportional to
the number of tile visits (a second or more for 16k-token problems), so the tables are
cached per ``(problem, schedule, num_workers, device)`` and :func:`prepare` can build many
of them in parallel processes before a benchmark starts.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dash_ref import Problem, Schedule, build_schedule

#: the tables a backward kernel reads, in the order the kernels take them (the one list:
#: a backend's launch imports it)
TABLE_NAMES = ("worker_offsets", "chain_bhj", "chain_offsets", "visit_q", "visit_rank")
#: the tables a kernel of packed batches reads beside them, uploaded for packed problems
#: only: where each sequence's dQ tiles (and semaphores) start
PACKED_TABLE_NAMES = ("q_tile_base",)
_CACHE_SIZE = 64


@dataclass(frozen=True)
class DeviceSchedule:
    """A validated schedule whose kernel tables live on one device."""

    problem: Problem
    name: str
    num_workers: int
    fingerprint: str
    tables: dict[str, torch.Tensor]  # TABLE_NAMES (+ PACKED_TABLE_NAMES) -> int32 tensors
    num_visits: int
    num_tiles: int  # dQ tiles B * H * n_q: one semaphore each

    @property
    def deterministic(self) -> bool:
        return self.name != "atomic"

    def schedule(self) -> Schedule:
        """The :class:`dash_ref.Schedule` itself (cached by ``build_schedule``)."""
        return build_schedule(self.problem, self.name, self.num_workers)


Key = tuple[Problem, str, int]
_host: dict[Key, tuple[str, dict[str, np.ndarray]]] = {}
_device: OrderedDict[tuple[Key, torch.device], DeviceSchedule] = OrderedDict()
_lock = threading.Lock()


def _names(problem: Problem) -> tuple[str, ...]:
    """The tables a kernel of ``problem`` reads (packed problems: ``q_tile_base`` too)."""
    return (*TABLE_NAMES, *PACKED_TABLE_NAMES) if problem.is_packed else TABLE_NAMES


def _build_host(key: Key) -> tuple[str, dict[str, np.ndarray]]:
    """Build, validate (coverage, deadlock, timing) and flatten one schedule."""
    problem, name, num_workers = key
    schedule = build_schedule(problem, name, num_workers).validate()
    tables = schedule.to_tables().as_dict(extra=problem.is_packed)
    return schedule.fingerprint(), {k: np.ascontiguousarray(tables[k], np.int32)
                                    for k in (*_names(problem), "dq_count")}


def device_schedule(problem: Problem, name: str, num_workers: int,
                    device: torch.device) -> DeviceSchedule:
    """The validated tables of ``name`` for ``problem`` on ``device`` (built at most once)."""
    key = (problem, name, int(num_workers))
    with _lock:
        hit = _device.get((key, device))
        if hit is not None:
            _device.move_to_end((key, device))
            return hit
    fingerprint, host = _host.pop(key, None) or _build_host(key)
    entry = DeviceSchedule(
        problem=problem, name=name, num_workers=int(num_workers), fingerprint=fingerprint,
        tables={k: torch.from_numpy(host[k]).to(device) for k in _names(problem)},
        num_visits=int(host["visit_q"].shape[0]), num_tiles=int(host["dq_count"].shape[0]),
    )
    with _lock:
        _device[(key, device)] = entry
        while len(_device) > _CACHE_SIZE:
            _device.popitem(last=False)
    return entry


def prepare(keys: Iterable[Key], processes: int | None = None) -> None:
    """Build and validate many schedules in parallel processes (host work only).

    Later :func:`device_schedule` calls for these keys only upload the tables. Use before
    timing many shapes; the worker processes never touch CUDA.
    """
    todo = [k for k in dict.fromkeys(keys) if k not in _host]
    if not todo:
        return
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        for key, result in zip(todo, pool.map(_build_host, todo, chunksize=1)):
            _host[key] = result


def clear_cache() -> None:
    """Forget every cached table (host and device)."""
    with _lock:
        _device.clear()
        _host.clear()
