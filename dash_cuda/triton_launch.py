"""Triton kernels launched through the compiled kernel the JIT made for the same arguments.

``kernel[grid](...)`` binds every argument, works out its specialization, builds a cache
key and looks the kernel up on every call: 43 - 48 us of host time for the backward's
``D`` launch on an H200 host, where calling the compiled kernel it returned took 15 - 16 us
(``benchmarks/results/host_costs.json``). :func:`launch` keeps each compiled kernel under a
key that fixes everything the JIT's choice depends on, and calls it as the JIT does. The key
holds every argument's value except for tensors (their dtype and whether the address is
16-byte aligned: what Triton specializes a pointer on) and floats (never specialized), so
it is finer than Triton's own key: a key found here names the kernel the JIT would have
launched. Same kernel, same arguments, same bits; only the JIT's bookkeeping is skipped.
The first call of a key, the interpreter's kernels and launches while Triton's launch
hooks are set (its profiler) take the JIT's path.
"""

from __future__ import annotations

import threading

import torch

_compiled: dict[tuple, object] = {}
_lock = threading.Lock()
_MAX_KEYS = 4096  # distinct shapes kept; past that the cache starts over


def _key_of(value):
    """What of one run-time argument the key holds."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, float):
        return float
    return value  # ints (value decides width and divisibility), bools, None


def _current_device() -> int:
    from triton.runtime import driver

    return driver.active.get_current_device()


def _current_stream(device: int) -> int:
    """The raw handle of ``device``'s current stream, as the JIT launches on."""
    from triton.runtime import driver

    return driver.active.get_current_stream(device)


def _hooks_set() -> bool:
    from triton import knobs

    runtime = knobs.runtime
    return any(getattr(hook, "calls", hook is not None)
               for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook))


def launch(kernel, grid: tuple[int, ...], args: tuple, constexprs: dict, **options) -> None:
    """``kernel[grid](*args, **constexprs, **options)`` on the current device's current
    stream: ``args`` the kernel's run-time arguments in order, ``constexprs`` the
    constexpr parameters after them, by name and in order, ``options`` compile options
    (``num_warps``, ``enable_fp_fusion``)."""
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):  # the interpreter's: nothing compiled to keep
        _check_order(kernel, len(args), constexprs)
        kernel[grid](*args, **constexprs, **options)
        return
    device = _current_device()
    key = (kernel, device, tuple(map(_key_of, args)), tuple(constexprs.items()),
           tuple(options.items()))
    with _lock:
        compiled = _compiled.get(key)
    if compiled is None or _hooks_set():
        _check_order(kernel, len(args), constexprs)
        compiled = kernel[grid](*args, **constexprs, **options)
        if hasattr(compiled, "result"):  # a compilation Triton ran asynchronously
            compiled = compiled.result()
        if not _hooks_set():
            with _lock:
                if len(_compiled) >= _MAX_KEYS:
                    _compiled.clear()
                _compiled[key] = compiled
        return
    stream = _current_stream(device)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 stream, compiled.function, compiled.packed_metadata, None, None, None,
                 *args, *constexprs.values())


def _check_order(kernel, given: int, constexprs: dict) -> None:
    """The compiled kernel takes its arguments in signature order: ``args``, then the
    constexprs, which must be the kernel's remaining parameters in that order."""
    names = list(kernel.arg_names[given:])
    if names != list(constexprs):
        raise TypeError(f"{kernel.fn.__name__}: launch() takes the run-time arguments, then "
                        f"the constexprs {names} in order, got {list(constexprs)}")


def clear_cache() -> None:
    """Forget every compiled kernel kept here (Triton's own caches stay)."""
    with _lock:
        _compiled.clear()


__all__ = ["clear_cache", "launch"]
