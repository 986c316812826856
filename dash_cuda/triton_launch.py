"""Triton kernels launched through their compiled objects, without the JIT's per-call work.

``kernel[grid](...)`` binds and specializes every argument, builds a cache key, checks the
kernel's globals and asks the driver for the device and stream on every call: on an H200
host that was 60 - 130 us per launch of the small kernels around the backward, more than
the kernels themselves run (``benchmarks/results/host_overhead.md``). :func:`launch` keeps
each specialization's compiled kernel under a key computed here by Triton's own rules
(each tensor's dtype and 16-byte alignment; each int's width and, unless the kernel does not
specialize it, whether it is 1 or a multiple of 16; each bool's value; the constexprs and
compile options) and calls it directly on the current stream. The first launch of a key goes
through the JIT, which compiles (or loads from its cache) and launches, and hands back the
compiled kernel. Same kernel, same arguments, same bits: only the host's bookkeeping is
skipped. Launch hooks (Triton's profiler) and the interpreter take the JIT's path.
"""

from __future__ import annotations

import threading

import torch

_compiled: dict[tuple, object] = {}
_lock = threading.Lock()
_I32 = 2**31


def _spec(value, specialize: bool):
    """What Triton specializes a kernel on for one argument's value."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        wide = not -_I32 <= value < _I32
        return ("i", wide, value == 1, value % 16 == 0) if specialize else ("i", wide)
    if isinstance(value, float):
        return ("f",)
    if value is None:
        return None
    raise TypeError(f"no specialization rule for an argument of type {type(value).__name__}")


def _no_hooks(hook) -> bool:
    return hook is None or not getattr(hook, "calls", True)  # (Triton 3.6: a HookChain)


def _direct() -> bool:
    """Whether compiled kernels may be called directly: no launch hooks, no interpreter."""
    from triton import knobs

    runtime = knobs.runtime
    return (_no_hooks(runtime.launch_enter_hook) and _no_hooks(runtime.launch_exit_hook)
            and not getattr(runtime, "interpret", False))


_constexprs: dict[object, tuple[str, ...]] = {}


def _constexpr_names(kernel, given: int) -> tuple[str, ...]:
    """The names of ``kernel``'s parameters after its ``given`` run-time ones: all
    constexprs (the kernels launched here take no optional run-time arguments)."""
    names = _constexprs.get(kernel)
    if names is None:
        rest = kernel.params[given:]
        if not all(p.is_constexpr for p in rest):
            raise TypeError(f"{kernel.__name__}: launch() takes every run-time argument")
        names = _constexprs[kernel] = tuple(p.name for p in rest)
    return names


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``: ``args`` the kernel's run-time arguments in order,
    ``meta`` its constexprs (by name) and compile options (``num_warps``,
    ``enable_fp_fusion``, ...). On the current device's current stream, as the JIT
    launches."""
    if not _direct():
        kernel[grid](*args, **meta)
        return
    device = torch.cuda.current_device()
    key = (kernel, device, tuple(meta.items()),
           tuple(_spec(a, not p.do_not_specialize) for a, p in zip(args, kernel.params)))
    with _lock:
        compiled = _compiled.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **meta)
        with _lock:
            _compiled[key] = compiled
        return
    constexprs = [meta[name] for name in _constexpr_names(kernel, len(args))]
    stream = torch.cuda.current_stream(device).cuda_stream
    compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *constexprs, stream=stream)


def clear_cache() -> None:
    """Forget every compiled kernel kept here (Triton's own caches stay)."""
    with _lock:
        _compiled.clear()


__all__ = ["clear_cache", "launch"]
