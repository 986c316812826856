"""CUDA graphs: a training step captured with ``torch.cuda.graph`` replays the eager bits.

The forward and the backward of a rectangular call do all their host work (plans, tables,
compiled kernels) before the first launch and allocate only from the caching allocator, so
a captured step is the same kernels on the same arguments: every replay must give O and
the gradients of an eager call on the same inputs, bit for bit, also after new values are
copied into the captured inputs. Outputs are poisoned with NaN before each replay, so an
element a replay fails to write shows. (Packed batches read their offsets to the host and
are not capturable.)
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import inputs, need

import dash_cuda

# S_q = 1024 causal: the CuTe forward hands its tiles out from a counter (a captured launch
# takes a fresh one, zeroed in the graph; an eager one its plan's, for the stream)
SHAPES = [((2, 4, 2, 1024, 1024), True), ((1, 4, 4, 384, 512), False)]


def eager_step(q, k, v, do, causal, backend):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = dash_cuda.attention(*leaves, causal=causal, backend=backend)
    return [o.detach(), *torch.autograd.grad(o, leaves, do)]


@pytest.mark.parametrize("shape, causal", SHAPES)
def test_a_captured_step_replays_the_eager_bits(backend, shape, causal):
    need(backend, 64)
    q, k, v, do = inputs(shape, 64, torch.bfloat16, seed=41)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    grad_out = do.clone()

    def step():
        o = dash_cuda.attention(*leaves, causal=causal, backend=backend)
        return [o, *torch.autograd.grad(o, leaves, grad_out)]

    side = torch.cuda.Stream()  # warm up off the default stream, as capture asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()

    fresh = inputs(shape, 64, torch.bfloat16, seed=42)
    for values in ((q, k, v, do), fresh, (q, k, v, do)):
        with torch.no_grad():
            for static, new in zip((*leaves, grad_out), values):
                static.copy_(new)
            for x in outs:
                x.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = eager_step(*values, causal, backend)
        for name, got, ref in zip(("O", "dQ", "dK", "dV"), outs, want):
            assert torch.equal(got, ref), f"{name}: the replay differs from the eager call"


def test_reduce_overhead_compilation_gives_the_eager_bits(backend):
    """``torch.compile(mode="reduce-overhead")`` replays the ops' forward and backward from
    CUDA graphs (after its warm-up calls): O and the gradients stay the eager call's."""
    need(backend, 64)
    shape = (2, 4, 2, 384, 384)

    def attend(q, k, v):
        return dash_cuda.attention(q, k, v, causal=True, backend=backend)

    def step(fn, q, k, v, do):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = fn(*leaves)
        o.backward(do)
        # a replay's outputs live in the graph's memory until the next replay: copy them
        return [o.detach().clone(), *(x.grad.clone() for x in leaves)]

    compiled = torch.compile(attend, mode="reduce-overhead")
    for seed in (43, 44, 45, 46, 43):  # the warm-up calls, then replays on new and old values
        values = inputs(shape, 64, torch.bfloat16, seed=seed)
        want = step(attend, *values)
        got = step(compiled, *values)
        for name, a, b in zip(("O", "dQ", "dK", "dV"), got, want):
            assert torch.equal(a, b), f"{name} differs from the eager call (seed {seed})"
