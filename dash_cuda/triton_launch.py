"""Triton kernels launched through the compiled kernel the JIT made for the same arguments.

``kernel[grid](...)`` binds every argument, works out its specialization, builds a cache
key and looks the kernel up on every call: 43 - 48 us of host time for the backward's
``D`` launch on an H200 host, where calling the compiled kernel it returned took 15 - 16 us
(measured before this module; ``benchmarks/host_costs.py`` probes today's). :func:`launch`
keeps each compiled kernel under a
key that fixes everything the JIT's choice depends on, and calls it as the JIT does. The key
holds every argument's value except for tensors (their dtype and whether the address is
16-byte aligned: what Triton specializes a pointer on) and positional floats (run-time
arguments, which Triton never specializes), so it is finer than Triton's own key: a key
found here names the kernel the JIT would have launched. Same kernel, same arguments, same
bits; only the JIT's bookkeeping is skipped.
The first call of a key, the interpreter's kernels and launches while Triton's launch
hooks are set (its profiler) take the JIT's path. Arguments after the positional ones are
named, in any order; the direct call passes every parameter in signature order, the ones
left out at their defaults, as the JIT's binding does.
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


#: Triton's objects that every launch asks, looked up on first use (importing dash_cuda
#: needs no Triton; an import statement per launch costs host time)
_triton: dict[str, object] = {}


def current_stream(device: int) -> int:
    """The raw handle of ``device``'s current stream, as the JIT launches on."""
    query = _triton.get("stream")
    if query is None:
        from triton.runtime import driver

        query = _triton["stream"] = driver.active.get_current_stream
    return query(device)


def _hooks_set() -> bool:
    """Whether Triton's launch hooks (its profiler's) are set."""
    runtime = _triton.get("knobs")
    if runtime is None:
        from triton import knobs

        runtime = _triton["knobs"] = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter is not None)
                or getattr(leave, "calls", leave is not None))


def _key(kernel, device: int, args: tuple, named: dict, options: dict) -> tuple:
    """The key a compiled kernel is kept under (see the module docstring)."""
    return (kernel, device, tuple(map(_key_of, args)),
            tuple((name, _named_key_of(value)) for name, value in named.items()),
            tuple(options.items()))


def launch(kernel, grid: tuple[int, ...], args: tuple, named: dict, **options) -> None:
    """``kernel[grid](*args, **named, **options)`` on the current device's current stream:
    ``args`` the kernel's first parameters in order, ``named`` others by name (constexprs
    or not; one left out takes its default), ``options`` compile options (``num_warps``,
    ``num_stages``, ``enable_fp_fusion``)."""
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):  # the interpreter's: nothing compiled to keep
        kernel[grid](*args, **named, **options)
        return
    device = _current_device()
    key = _key(kernel, device, args, named, options)
    with _lock:
        kept = _compiled.get(key)
    if kept is None or _hooks_set():
        _jit_launch(kernel, grid, args, named, options, key)
        return
    _run(_direct(device, kept, grid, named), args)


def _direct(device: int, kept: tuple, grid: tuple[int, ...], named: dict) -> tuple:
    """What a direct call of a kept compiled kernel needs beside the positional arguments:
    ``(device, compiled, grid xyz, the parameters after them in signature order, those left
    out at their defaults)``."""
    compiled, after = kept
    return (device, compiled, (*grid, 1, 1)[:3],
            tuple(named.get(name, default) for name, default in after))


def _run(direct: tuple, args) -> None:
    """Call the compiled kernel of :func:`_direct` as the JIT does: every parameter in
    signature order, on the device's current stream."""
    device, compiled, (x, y, z), tail = direct
    compiled.run(x, y, z, current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *tail)


def _jit_launch(kernel, grid, args, named, options, key) -> None:
    """The JIT's launch, which compiles on a key's first call; the compiled kernel is kept
    under ``key`` (not while launch hooks are set: a profiler's launches stay the JIT's)."""
    compiled = kernel[grid](*args, **named, **options)  # unknown names raise here
    if hasattr(compiled, "result"):  # a compilation Triton ran asynchronously
        compiled = compiled.result()
    if not _hooks_set():
        with _lock:
            if len(_compiled) >= _MAX_KEYS:
                _compiled.clear()
            _compiled[key] = (compiled, _after(kernel, len(args)))


class Bound:
    """One launch worked out once but for the tensors that change every call: ``bind``'s
    arguments with :attr:`slots` (positions in ``args``) filled per call.

    Each call's tensors must have the dtypes and 16-byte alignment of those ``bind`` saw
    (what the compiled kernel was specialized on; fresh allocations are aligned, and a
    caller keys its :class:`Bound` on the alignment of any other tensor). Calls take the
    compiled kernel directly, with no key to build and each tensor passed as its address:
    the first (which compiles, if needed) and those while launch hooks are set take
    :func:`launch`'s path.
    """

    __slots__ = ("kernel", "grid", "args", "named", "options", "slots", "_direct")

    def __init__(self, kernel, grid: tuple[int, ...], args: tuple, named: dict,
                 slots: tuple[int, ...], options: dict):
        self.kernel, self.grid, self.args, self.named = kernel, grid, args, named
        self.slots, self.options = slots, options
        self._direct = None  # what _run needs (_direct), once the kernel is compiled

    def __call__(self, *tensors) -> None:
        args = list(self.args)
        direct = self._direct
        if direct is None or _hooks_set():
            for slot, value in zip(self.slots, tensors, strict=True):
                args[slot] = value
            launch(self.kernel, self.grid, tuple(args), self.named, **self.options)
            if direct is None:
                self._direct = self._find(tuple(args))
            return
        # the compiled kernel takes a pointer as an int too, without asking the driver
        # whether it points into device memory (the first call's tensors were checked)
        for slot, value in zip(self.slots, tensors, strict=True):
            args[slot] = value.data_ptr()
        _run(direct, args)

    def _find(self, args: tuple):
        """The compiled kernel :func:`launch` kept for these arguments, with what a direct
        call needs beside them (None: the interpreter's kernel, or not kept)."""
        from triton.runtime.jit import JITFunction

        if not isinstance(self.kernel, JITFunction):
            return None
        device = _current_device()
        with _lock:
            kept = _compiled.get(_key(self.kernel, device, args, self.named, self.options))
        return None if kept is None else _direct(device, kept, self.grid, self.named)


def bind(kernel, grid: tuple[int, ...], args: tuple, named: dict, per_call: tuple,
         **options) -> Bound:
    """:class:`Bound` launch of ``kernel`` (the arguments as :func:`launch` takes them):
    ``per_call`` are tensors among ``args`` that each call replaces with its own, in the
    order the call passes them (the bound launch keeps none of them)."""
    slots = []
    for tensor in per_call:
        at = [i for i, arg in enumerate(args) if arg is tensor]
        if not at:
            raise ValueError("a per-call tensor is not among the positional arguments")
        slots.append(at[0])
    kept = tuple(None if i in slots else arg for i, arg in enumerate(args))
    return Bound(kernel, tuple(grid), kept, dict(named), tuple(slots), options)


def _named_key_of(value):
    """What of one named argument the key holds: a tensor's dtype and alignment, any other
    value itself (a named float may be a constexpr, which the kernel is compiled for)."""
    return _key_of(value) if isinstance(value, torch.Tensor) else value


def _after(kernel, given: int) -> tuple[tuple[str, object], ...]:
    """``(name, default)`` of each of ``kernel``'s parameters after the first ``given``, in
    signature order (a parameter without a default is always named: the JIT's first launch
    refused the call otherwise)."""
    return tuple((p.name, p.default if p.has_default else None)
                 for p in kernel.params[given:])


def clear_cache() -> None:
    """Forget every compiled kernel kept here (Triton's own caches stay)."""
    with _lock:
        _compiled.clear()


__all__ = ["Bound", "bind", "clear_cache", "current_stream", "launch"]
