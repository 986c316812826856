"""dash_cuda: Hopper kernels for a deterministic attention backward that runs dash_ref schedules.

``attention`` is a drop-in autograd function; ``attention_forward`` / ``attention_backward``
expose the two passes (the backward with an ``audit`` mode that returns every fp32 dQ
partial); ``flash_attn_func`` is ``attention`` under FlashAttention's name, with its
packed-QKV and packed-KV forms (``flash_attn_qkvpacked_func``, ``flash_attn_kvpacked_func``).
``attention_varlen`` (and FlashAttention's name for it, ``flash_attn_varlen_func``) takes
packed batches of variable lengths (with the packed-QKV and packed-KV forms
``flash_attn_varlen_qkvpacked_func`` and ``flash_attn_varlen_kvpacked_func``), with
``attention_varlen_forward`` /
``attention_varlen_backward`` as its passes. Importing this package needs neither CUDA nor a
kernel compiler: kernels load on first use.

Where things live: :mod:`.api` (the public functions), :mod:`.checks` (input validation),
:mod:`.launch` (the launch every backend shares: schedule tables, residency, scratch, the
audit record), :mod:`.plans` (a call's launches kept per signature), :mod:`.calls` (a public
call's checked options and plan, kept by its arguments), :mod:`.tables`
(schedules on the device), :mod:`.prepost` (the small kernels around every backward),
:mod:`.triton_launch` (Triton launches through their compiled kernels), and
:mod:`.backends` (one folder per kernel technology).
"""

from dash_ref import __version__

from .api import (
    LAYOUTS,
    attention,
    attention_backward,
    attention_forward,
    attention_varlen,
    attention_varlen_backward,
    attention_varlen_forward,
    backward_problem,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .backends import BACKENDS, HEAD_DIMS
from .launch import BackwardAudit

__all__ = ["__version__", "BACKENDS", "HEAD_DIMS", "LAYOUTS", "BackwardAudit", "attention",
           "attention_backward", "attention_forward", "attention_varlen",
           "attention_varlen_backward", "attention_varlen_forward", "backward_problem",
           "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func"]
