"""``dash_cuda.flash_attn_func``: ``attention`` under FlashAttention's name, argument names
and order, so that ``from dash_cuda import flash_attn_func`` replaces FlashAttention's.

Its options are FlashAttention's, in FlashAttention's positions; those dash_cuda does not
compute are refused by name in one line; the rest reach ``attention`` as written (checked
here by recording what ``attention`` receives, since no kernel runs on the CPU).
"""

from __future__ import annotations

import inspect

import pytest
import torch

import dash_cuda
from dash_cuda import api


def tensors():
    return [torch.randn(1, 8, 2, 64, dtype=torch.bfloat16) for _ in range(3)]


def test_flash_attentions_positional_order():
    names = list(inspect.signature(dash_cuda.flash_attn_func).parameters)
    assert names[:11] == ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size",
                          "softcap", "alibi_slopes", "deterministic", "return_attn_probs"]
    keyword_only = [n for n, p in inspect.signature(dash_cuda.flash_attn_func).parameters.items()
                    if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == ["schedule", "num_workers", "exact", "backend", "portable",
                            "learnable_sink"]


def test_every_option_reaches_attention_as_written(monkeypatch):
    seen = {}
    monkeypatch.setattr(api, "attention", lambda *a, **kw: seen.update(args=a, kw=kw) or "o")
    sink = torch.zeros(2)
    q, k, v = tensors()
    out = dash_cuda.flash_attn_func(q, k, v, 0.0, 0.25, True, (64, 0), 30.0, None, False,
                                    False, schedule="naive", num_workers=7, exact=False,
                                    backend="triton", portable=False, learnable_sink=sink)
    assert out == "o" and seen["args"] == (q, k, v)
    assert seen["kw"] == dict(causal=True, softmax_scale=0.25, schedule="naive",
                              deterministic=False, num_workers=7, exact=False,
                              backend="triton", portable=False, window_size=(64, 0),
                              softcap=30.0, learnable_sink=sink)


def test_deterministic_is_the_default():
    assert inspect.signature(dash_cuda.flash_attn_func).parameters["deterministic"].default


@pytest.mark.parametrize("option, value", [
    ("dropout_p", 0.1), ("alibi_slopes", torch.ones(2)), ("return_attn_probs", True),
])
def test_options_dash_does_not_compute_are_refused_by_name(option, value):
    with pytest.raises(ValueError) as info:
        dash_cuda.flash_attn_func(*tensors(), **{option: value})
    text = str(info.value)
    assert "\n" not in text and text.startswith("flash_attn_func:") and f"{option}=" in text


def test_every_refused_option_is_named_at_once():
    with pytest.raises(ValueError) as info:
        dash_cuda.flash_attn_func(*tensors(), 0.1, None, False, (-1, -1), 0.0, torch.ones(2),
                                  True, True)
    text = str(info.value)
    assert "dropout_p=0.1" in text and "alibi_slopes=<tensor of shape (2,)>" in text
    assert "return_attn_probs=True" in text


def test_taken_options_are_checked_by_attention_before_the_device():
    """A bad window reaches attention's checks (one line naming it), before the CUDA check."""
    with pytest.raises(ValueError, match=r"window_size\[0\] must be >= 0"):
        dash_cuda.flash_attn_func(*tensors(), window_size=(-4, 0))
    with pytest.raises(ValueError, match="CUDA"):
        dash_cuda.flash_attn_func(*tensors(), causal=True)
