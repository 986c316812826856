"""The Triton backend: the portable kernels, and the one that carries ``exact=True`` (L2).

- :mod:`.fwd_kernel`: the forward, FlashAttention's online softmax in base 2;
- :mod:`.bwd_kernel`: the persistent backward that runs any schedule's tables;
- :mod:`.mask`: which keys a query row sees (the kernels' twin of :class:`dash_ref.Mask`);
- :mod:`.config`: tiles and launch settings per head dim;
- :mod:`.launch`: kernel arguments and residency;
- :mod:`.contract`: which instruction each step of the arithmetic contract becomes;
- :mod:`.inspect_asm`: reads those instructions off the compiled PTX and SASS.

Importing this package imports no Triton; :data:`BACKEND` loads the kernels on first use.
"""

from __future__ import annotations

import importlib.util

import torch

from ...backends import FEATURES, Case
from .config import HEAD_DIMS, backward_config


class TritonBackend:
    """The Triton kernels behind the :class:`dash_cuda.backends.Backend` interface."""

    name = "triton"
    #: the dQ hand-off is ``red.global.add.f32``, which flushes subnormals
    dq_add_flushes_subnormals = True
    #: its default forward (approximate division, ``tl.sum`` rows) and ``D`` are not
    #: reproduced on the CPU: only ``exact=True`` is (L2)
    default_arithmetic = None
    #: the optional score features its kernels compute (softcap, learnable sinks; not
    #: with ``exact=True``, which the options refuse)
    features = frozenset(FEATURES)

    def missing(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "Triton is not installed (pip install 'dash-attention[gpu]')"
        return None

    def unsupported(self, case: Case) -> str | None:  # packed batches, windows included
        if case.head_dim not in HEAD_DIMS:
            return f"head dim {case.head_dim} (supported: {HEAD_DIMS})"
        if case.head_dim_v not in (None, *HEAD_DIMS):
            return f"value head dim {case.head_dim_v} (supported: {HEAD_DIMS})"
        if case.dtype not in (torch.bfloat16, torch.float16):
            return f"dtype {case.dtype}"
        return None

    def backward_tiles(self, head_dim: int, mask: str, head_dim_v: int | None = None
                       ) -> tuple[int, int]:
        cfg = backward_config(head_dim, head_dim_v)  # the same tiles for every mask
        return cfg.block_m, cfg.block_n

    def forward_block_n(self, head_dim: int) -> None:
        """None: the default forward is not reproduced on the CPU (see default_arithmetic)."""
        return None

    def forward(self, q, k, v, mask, softmax_scale, poison, softcap=0.0, sink2=None):
        from .launch import run_forward

        return run_forward(q, k, v, mask, softmax_scale, poison, softcap, sink2)

    def forward_varlen(self, q, k, v, packing, mask, softmax_scale, poison, softcap=0.0,
                       sink2=None):
        from .launch import run_forward_varlen

        return run_forward_varlen(q, k, v, packing, mask, softmax_scale, poison, softcap,
                                  sink2)

    def dq_acc_shape(self, problem):
        p = problem
        rows = (p.total_q,) if p.is_packed else (p.batch, p.seqlen_q)
        return (*rows, p.heads, p.head_dim)

    def dq_acc_rows(self, dq_acc, problem):
        return dq_acc

    def finish_dq(self, dq_acc, dq, problem, softmax_scale):
        from dash_cuda.prepost import finish_dq

        if problem.is_packed:  # row-wise: the packed rows as one sequence
            dq_acc, dq = dq_acc.unsqueeze(0), dq.unsqueeze(0)
        finish_dq(dq_acc, dq, softmax_scale, problem.block_m)

    def new_partials(self, num_visits, problem, device):
        return torch.empty((num_visits, problem.block_m, problem.head_dim), device=device,
                           dtype=torch.float32)

    def partials_rows(self, partials, problem):
        return partials

    def max_workers(self, launch) -> int:
        from .launch import max_workers

        return max_workers(launch)

    def run_schedule(self, launch) -> None:
        from .launch import run_schedule

        run_schedule(launch)


BACKEND = TritonBackend()
