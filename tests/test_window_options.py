"""A call's window as an option: read as FlashAttention reads it, checked once, carried whole.

``window_size=(left, right)`` with ``causal`` becomes one :class:`dash_ref.Mask`
(``Mask.of``); the options keep the window of that rule, so two spellings of one rule are
one value; ``banded`` (made for bands) is a schedule of windowed calls only; the custom ops
take the window as ``int[]`` and rebuild the same value; a bad window is refused in one line
naming ``window_size`` before anything looks at the device.
"""

from __future__ import annotations

import pytest
import torch

import dash_cuda
from dash_cuda.options import FIELDS, Options
from dash_ref import Mask


@pytest.mark.parametrize("causal, window, kind, kept", [
    (False, (-1, -1), "full", (-1, -1)),
    (True, (-1, -1), "causal", (-1, -1)),
    (False, (-1, 0), "causal", (-1, -1)),  # FlashAttention: (-1, 0) is the causal mask
    (False, (128, 0), "window", (128, 0)),
    (True, (128, 64), "window", (128, 0)),  # causal drops the right side
    (False, (3, 5), "window", (3, 5)),
    (False, None, "full", (-1, -1)),
])
def test_the_window_is_read_as_flash_attention_reads_it(causal, window, kind, kept):
    options = Options.checked(64, causal=causal, window_size=window)
    assert options.mask == Mask.of(causal, window) and options.mask.kind == kind
    assert options.window_size == kept


@pytest.mark.parametrize("one, other", [
    (dict(causal=True, window_size=(128, 64)), dict(causal=True, window_size=(128, 0))),
    (dict(causal=True, window_size=(128, 0)), dict(causal=False, window_size=(128, 0))),
    (dict(causal=False, window_size=(-1, 0)), dict(causal=True)),
])
def test_two_spellings_of_one_rule_are_one_value(one, other):
    a, b = Options.checked(64, **one), Options.checked(64, **other)
    assert a == b and hash(a) == hash(b) and a.mask == b.mask


def test_the_ops_rebuild_the_same_value_from_their_arguments():
    options = Options.checked(64, causal=False, window_size=(7, 9), schedule="banded")
    flat = options.flat()
    at = FIELDS.index("window_size")
    assert flat[at] == (7, 9)
    # the op hands the window back as a list
    rebuilt = Options(*flat[:at], list(flat[at]), *flat[at + 1:])
    assert rebuilt == options and rebuilt.mask == Mask("window", 7, 9)
    schema = str(torch.ops.dash.attention.default._schema)
    assert "SymInt[] window_size" in schema or "int[] window_size" in schema


def test_banded_is_a_schedule_of_windowed_calls_only():
    assert Options.checked(64, window_size=(8, 8), schedule="banded").schedule == "banded"
    assert Options.checked(64, window_size=(8, 8), schedule="banded", portable=True).portable
    with pytest.raises(ValueError, match="unknown schedule 'banded'"):
        Options.checked(64, causal=True, schedule="banded")


@pytest.mark.parametrize("window, error, says", [
    ((-2, 0), ValueError, r"window_size\[0\] must be >= 0, or -1"),
    ((0, -5), ValueError, r"window_size\[1\] must be >= 0, or -1"),
    ((1.5, 0), TypeError, r"window_size\[0\] must be an int"),
    ((True, 0), TypeError, r"window_size\[0\] must be an int"),
    ((3,), TypeError, "window_size must be a pair"),
    ("ab", TypeError, "window_size must be a pair"),
])
def test_bad_windows_are_refused_in_one_line_before_the_device_is_asked(window, error, says):
    """CPU tensors: the window's error comes first, not the one about CUDA."""
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    packed = torch.randn(8, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    calls = [lambda: dash_cuda.attention(q, q, q, window_size=window),
             lambda: dash_cuda.attention_forward(q, q, q, window_size=window),
             lambda: dash_cuda.attention_varlen(packed, packed, packed, cu, cu, 8, 8,
                                                window_size=window),
             lambda: dash_cuda.flash_attn_varlen_func(packed, packed, packed, cu, cu, 8, 8,
                                                      window_size=window)]
    for call in calls:
        with pytest.raises(error, match=says) as info:
            call()
        assert "\n" not in str(info.value)
