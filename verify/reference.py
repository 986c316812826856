"""Float64 attention through PyTorch autograd: the everyday reference for accuracy checks.

:func:`attention_f64` also measures each output's rounding-term magnitude ``M`` (the model
of ``verify.highprec``: the size of everything a bf16/fp16 rounding can perturb, final
rounding included), so :func:`grad_checks` can hold a result to
``||x - exact|| <= error_bound(dtype, kappa=1) * M``. That is the normwise bound
``error_bound(dtype, kappa=M/||exact||)`` where the exact output is nonzero, and it stays
meaningful where the exact output cancels to zero (``S_k = 1`` makes ``dQ = 0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dash_ref._checks import attention_inputs
from dash_ref.arithmetic.steps import resolve_scale
from dash_ref.cpu import single_threaded
from dash_ref.schedules.mask import Mask
from verify.highprec import add_rounding_magnitudes, error_bound


@dataclass
class Grads:
    o: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    magnitude: dict[str, float] = field(default_factory=dict)  # M per output
    shape: dict[str, int] = field(default_factory=dict)  # error_bound's shape arguments


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bottom-right causal mask ``(S_q, S_k)``: row ``r`` sees ``c`` iff ``c <= r + S_k - S_q``
    (the rule of :class:`dash_ref.schedules.mask.Mask`)."""
    mask = Mask("causal").visible(range(seqlen_q), range(seqlen_k), seqlen_q, seqlen_k)
    return mask.to(device)


@single_threaded
def attention_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  causal: bool = False, softmax_scale: float | None = None) -> Grads:
    """Output and gradients in float64 for ``(B, S, H, d)`` inputs (GQA by head repetition).

    Rows that see no key give ``O = 0`` and zero gradients. NaN and infinity propagate as in
    PyTorch's SDPA: a NaN or an infinite score in a row makes that row's output NaN.
    """
    attention_inputs(q, k, v, do=do)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    do64 = do.detach().double()
    group = q.shape[2] // k.shape[2]
    kk, vv = k64.repeat_interleave(group, 2), v64.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kk) * scale
    seen = torch.ones(q.shape[1], 1, dtype=torch.bool, device=q.device)
    if causal:
        mask = causal_mask(q.shape[1], k.shape[1], q.device)
        s = s.masked_fill(~mask, -math.inf)
        seen = mask.any(-1, keepdim=True)
    # a row that sees no key is 0 by convention; only such rows are kept out of the softmax,
    # so a NaN or infinity in the inputs still reaches the outputs
    p = torch.where(seen, torch.softmax(torch.where(seen, s, 0.0), dim=-1), 0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o.backward(do64)
    with torch.no_grad():
        dp = torch.einsum("bqhd,bkhd->bhqk", do64, vv)
        ds = p * (dp - (do64 * o).sum(-1).transpose(1, 2)[..., None])
        mag = dict.fromkeys(("o", "dq", "dk", "dv"), 0.0)
        for b in range(q.shape[0]):
            for h in range(q.shape[2]):
                add_rounding_magnitudes(
                    mag, scale * scale, *(t[b, h].cpu().numpy() for t in (p, ds, dp)),
                    *(t[b, :, hh].detach().cpu().numpy()
                      for t, hh in ((o, h), (q64, h), (k64, h // group), (v64, h // group),
                                    (do64, h))))
    grads = Grads(o.detach(), q64.grad, k64.grad, v64.grad)
    for name in mag:
        grads.magnitude[name] = math.sqrt(mag[name] + float(getattr(grads, name).square().sum()))
    grads.shape = {"seqlen_q": q.shape[1], "seqlen_k": k.shape[1], "head_dim": q.shape[3],
                   "group": group}
    return grads


@dataclass
class GradCheck:
    name: str
    error: float  # ||x - exact||_F
    normwise: float  # error / ||exact||_F (inf when the exact output is zero and x is not)
    allowed: float  # largest admissible ||x - exact||_F
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.error <= self.allowed


def grad_checks(got: dict[str, torch.Tensor], ref: Grads, dtype: torch.dtype
                ) -> dict[str, GradCheck]:
    """Hold each output in ``got`` (keys among ``o, dq, dk, dv``) to its bound (module doc)."""
    out = {}
    for name, x in got.items():
        exact = getattr(ref, name).to(x.device)
        xd = x.detach().double()
        err = float((xd - exact).norm())
        norm = float(exact.norm())
        allowed = error_bound(dtype, name, 1.0, **ref.shape) * ref.magnitude[name]
        normwise = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
        out[name] = GradCheck(name, err, normwise, allowed, bool(torch.isfinite(xd).all()))
    return out
