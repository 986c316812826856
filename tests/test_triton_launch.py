"""``dash_cuda.triton_launch.launch``: the JIT's kernel, called directly once it is known.

A stand-in for a ``JITFunction`` records what the JIT would launch and what the compiled
kernel is called with; no GPU is needed to check which path a launch takes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from triton.runtime.jit import JITFunction

from dash_cuda import triton_launch


class Compiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


def param(name, default=None, has_default=False):
    return SimpleNamespace(name=name, default=default, has_default=has_default)


class Kernel(JITFunction):
    """A kernel ``(X, n, scale, BM: constexpr, D: constexpr, CAP=None, WIDE: constexpr =
    False)`` that compiles on each JIT launch."""

    def __init__(self):  # none of JITFunction's own state: nothing here compiles
        self.params = [param("X"), param("n"), param("scale"), param("BM"), param("D"),
                       param("CAP", None, True), param("WIDE", False, True)]
        self.arg_names = [p.name for p in self.params]
        self.fn = lambda: None
        self.jit_launches = []

    __hash__ = object.__hash__  # (JITFunction hashes its source)

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            unknown = set(kwargs) - set(self.arg_names) - {"num_warps", "num_stages"}
            if unknown:
                raise TypeError(f"unexpected keyword arguments {unknown}")
            self.jit_launches.append((grid, args, kwargs))
            return Compiled()
        return jit


@pytest.fixture
def kernel(monkeypatch):
    triton_launch.clear_cache()
    monkeypatch.setattr(triton_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(triton_launch, "current_stream", lambda device: 1234)
    monkeypatch.setattr(triton_launch, "_hooks_set", lambda: False)
    yield Kernel()
    triton_launch.clear_cache()


def kept() -> Compiled:
    ((compiled, _),) = triton_launch._compiled.values()
    return compiled


def test_the_first_launch_of_a_key_goes_through_the_jit_later_ones_call_its_kernel(kernel):
    x, y = torch.randn(64), torch.randn(64)
    triton_launch.launch(kernel, (4, 2), (x, 64, 0.5), dict(BM=64, D=128), num_warps=4)
    assert kernel.jit_launches == [((4, 2), (x, 64, 0.5), dict(BM=64, D=128, num_warps=4))]
    # other tensors of the same dtype and alignment, another positional float: the kept
    # kernel, every parameter in signature order, the ones left out at their defaults
    triton_launch.launch(kernel, (4, 2), (y, 64, 0.25), dict(BM=64, D=128), num_warps=4)
    assert len(kernel.jit_launches) == 1
    assert kept().calls == [(4, 2, 1, 1234, "function", "metadata", None, None, None,
                             y, 64, 0.25, 64, 128, None, False)]


def test_named_arguments_reach_the_kernel_in_signature_order(kernel):
    x, cap = torch.randn(64), torch.randn(4)
    for _ in range(2):
        triton_launch.launch(kernel, (1,), (x, 8, 1.0),
                             dict(WIDE=True, CAP=cap, D=64, BM=32))
    assert len(kernel.jit_launches) == 1
    assert kept().calls == [(1, 1, 1, 1234, "function", "metadata", None, None, None,
                             x, 8, 1.0, 32, 64, cap, True)]


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "named float",
                                    "named tensor alignment", "option"])
def test_anything_the_jit_specializes_on_takes_the_jit_again(kernel, change):
    x = torch.randn(64)
    args, named, options = (x, 64, 0.5), dict(BM=64, D=128, CAP=2.0), dict(num_warps=4)
    triton_launch.launch(kernel, (1,), args, named, **options)
    if change == "int":
        args = (x, 65, 0.5)
    elif change == "dtype":
        args = (x.double(), 64, 0.5)
    elif change == "alignment":  # 4 bytes past a 16-byte aligned address
        args = (x[1:], 64, 0.5)
    elif change == "constexpr":
        named = dict(named, BM=128)
    elif change == "named float":  # a named float may be a constexpr: keyed by its value
        named = dict(named, CAP=3.0)
    elif change == "named tensor alignment":
        named = dict(named, CAP=x[1:])
        triton_launch.launch(kernel, (1,), args, dict(named, CAP=x), **options)
        assert len(kernel.jit_launches) == 2
    else:
        options = dict(num_warps=8)
    triton_launch.launch(kernel, (1,), args, named, **options)
    assert len(kernel.jit_launches) == (3 if change == "named tensor alignment" else 2)


def test_launch_hooks_keep_every_launch_on_the_jit(kernel, monkeypatch):
    monkeypatch.setattr(triton_launch, "_hooks_set", lambda: True)
    for _ in range(3):
        triton_launch.launch(kernel, (1,), (torch.randn(8), 8, 1.0), dict(BM=64, D=128))
    assert len(kernel.jit_launches) == 3 and not triton_launch._compiled


@pytest.mark.parametrize("chain", ["launch_enter_hook", "launch_exit_hook"])
def test_a_hook_added_to_either_of_tritons_launch_chains_is_seen(chain):
    """What Triton's profiler does (``knobs.runtime.<chain>.add``) is seen by the next
    launch, also after launches that found no hook; removed, it is no longer seen."""
    from triton import knobs

    assert not triton_launch._hooks_set()

    def hook(*args):
        pass

    getattr(knobs.runtime, chain).add(hook)
    try:
        assert triton_launch._hooks_set()
    finally:
        getattr(knobs.runtime, chain).remove(hook)
    assert not triton_launch._hooks_set()


def test_an_unknown_name_is_refused_by_the_jit_and_nothing_is_kept(kernel):
    with pytest.raises(TypeError, match="unexpected keyword"):
        triton_launch.launch(kernel, (1,), (torch.randn(8), 8, 1.0),
                             dict(BM=64, D=128, DEPTH=3))
    assert not triton_launch._compiled


def test_a_bound_launch_fills_its_tensors_and_calls_the_kept_kernel(kernel):
    """:func:`bind`: the first call goes through :func:`launch` (the JIT here), later ones
    call the compiled kernel with each call's tensors in their places, as their addresses,
    and nothing else worked out again; the bound launch holds none of the tensors it was
    bound with."""
    x, cap = torch.randn(64), torch.randn(4)
    bound = triton_launch.bind(kernel, (4, 2), (x, 64, 0.5), dict(CAP=cap, BM=64, D=128),
                               (x,), num_warps=4)
    assert bound.args == (None, 64, 0.5)
    y, z = torch.randn(64), torch.randn(64)
    bound(y)
    assert kernel.jit_launches == [((4, 2), (y, 64, 0.5), dict(CAP=cap, BM=64, D=128,
                                                                 num_warps=4))]
    bound(z)
    assert len(kernel.jit_launches) == 1
    assert kept().calls == [(4, 2, 1, 1234, "function", "metadata", None, None, None,
                             z.data_ptr(), 64, 0.5, 64, 128, cap, False)]


def test_a_bound_launch_takes_its_tensors_in_the_order_given(kernel):
    a, b = torch.randn(8), torch.randn(8)
    with pytest.raises(ValueError, match="not among"):
        triton_launch.bind(kernel, (1,), (a, 8, 1.0), dict(BM=64, D=128), (b,))
    bound = triton_launch.bind(kernel, (1,), (a, 8, 1.0), dict(BM=64, D=128, CAP=b), (a,))
    assert bound.slots == (0,)


def test_a_bound_launch_under_launch_hooks_stays_on_the_jit(kernel, monkeypatch):
    x = torch.randn(8)
    bound = triton_launch.bind(kernel, (1,), (x, 8, 1.0), dict(BM=64, D=128), (x,))
    bound(torch.randn(8))
    monkeypatch.setattr(triton_launch, "_hooks_set", lambda: True)
    bound(torch.randn(8))
    bound(torch.randn(8))
    assert len(kernel.jit_launches) == 3 and kept().calls == []
