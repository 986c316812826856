"""``dash_cuda.triton_launch.launch``: the JIT's kernel, called directly once it is known.

A stand-in for a ``JITFunction`` records what the JIT would launch and what the compiled
kernel is called with; no GPU is needed to check which path a launch takes.
"""

from __future__ import annotations

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


class Kernel(JITFunction):
    """A kernel ``(X, n, scale, BM: constexpr, D: constexpr)`` that compiles on each JIT
    launch."""

    def __init__(self):  # none of JITFunction's own state: nothing here compiles
        self.arg_names = ["X", "n", "scale", "BM", "D"]
        self.fn = lambda: None
        self.jit_launches = []

    __hash__ = object.__hash__  # (JITFunction hashes its source)

    def __getitem__(self, grid):
        def jit(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            return Compiled()
        return jit


@pytest.fixture
def kernel(monkeypatch):
    triton_launch.clear_cache()
    monkeypatch.setattr(triton_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(triton_launch, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(triton_launch, "_hooks_set", lambda: False)
    yield Kernel()
    triton_launch.clear_cache()


def test_the_first_launch_of_a_key_goes_through_the_jit_later_ones_call_its_kernel(kernel):
    x, y = torch.randn(64), torch.randn(64)
    triton_launch.launch(kernel, (4, 2), (x, 64, 0.5), dict(BM=64, D=128), num_warps=4)
    assert kernel.jit_launches == [((4, 2), (x, 64, 0.5), dict(BM=64, D=128, num_warps=4))]
    # other tensors of the same dtype and alignment, another float: the kept kernel
    triton_launch.launch(kernel, (4, 2), (y, 64, 0.25), dict(BM=64, D=128), num_warps=4)
    assert len(kernel.jit_launches) == 1
    compiled = triton_launch._compiled[next(iter(triton_launch._compiled))]
    assert compiled.calls == [(4, 2, 1, 1234, "function", "metadata", None, None, None,
                               y, 64, 0.25, 64, 128)]


@pytest.mark.parametrize("change", ["int", "dtype", "alignment", "constexpr", "option"])
def test_anything_the_jit_specializes_on_takes_the_jit_again(kernel, change):
    x = torch.randn(64)
    triton_launch.launch(kernel, (1,), (x, 64, 0.5), dict(BM=64, D=128), num_warps=4)
    args, constexprs, options = (x, 64, 0.5), dict(BM=64, D=128), dict(num_warps=4)
    if change == "int":
        args = (x, 65, 0.5)
    elif change == "dtype":
        args = (x.double(), 64, 0.5)
    elif change == "alignment":  # 4 bytes past a 16-byte aligned address
        args = (x[1:], 64, 0.5)
    elif change == "constexpr":
        constexprs = dict(BM=128, D=128)
    else:
        options = dict(num_warps=8)
    triton_launch.launch(kernel, (1,), args, constexprs, **options)
    assert len(kernel.jit_launches) == 2


def test_launch_hooks_keep_every_launch_on_the_jit(kernel, monkeypatch):
    monkeypatch.setattr(triton_launch, "_hooks_set", lambda: True)
    for _ in range(3):
        triton_launch.launch(kernel, (1,), (torch.randn(8), 8, 1.0), dict(BM=64, D=128))
    assert len(kernel.jit_launches) == 3 and not triton_launch._compiled


def test_constexprs_out_of_signature_order_are_refused(kernel):
    with pytest.raises(TypeError, match=r"constexprs \['BM', 'D'\] in order"):
        triton_launch.launch(kernel, (1,), (torch.randn(8), 8, 1.0), dict(D=128, BM=64))
    assert not kernel.jit_launches
