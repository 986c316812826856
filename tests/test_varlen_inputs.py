"""``dash_cuda.attention_varlen`` and its passes reject bad input with a one-line error that
names the argument, before anything needs CUDA or Triton.

CPU tensors throughout: the shape, dtype and offset checks (the offsets' values too, read
to the host) run before the CUDA device check, so a valid call gets as far as "needs CUDA
tensors", and every bad one stops earlier with its own message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dash_cuda

GEN = torch.Generator().manual_seed(20260501)
SEQLENS_Q, SEQLENS_K = (5, 0, 37, 16), (9, 3, 20, 16)
CUDA = "needs CUDA tensors"


def rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=GEN).to(dtype)


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def call(h=4, hk=2, d=32, dtype=torch.bfloat16, seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K):
    """The arguments of a valid call: ``q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k``."""
    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    return [rand(total_q, h, d, dtype=dtype), rand(total_k, hk, d, dtype=dtype),
            rand(total_k, hk, d, dtype=dtype), offsets(seqlens_q), offsets(seqlens_k),
            max(seqlens_q), max(seqlens_k)]


def backward_call(**kw):
    q, k, v, cu_q, cu_k, max_q, max_k = call(**kw)
    return dict(q=q, k=k, v=v, o=rand(*q.shape, dtype=q.dtype),
                lse=torch.randn(q.shape[0], q.shape[1], generator=GEN),
                do=rand(*q.shape, dtype=q.dtype), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                max_seqlen_q=max_q, max_seqlen_k=max_k)


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_valid_calls_reach_the_device_check():
    for kw in (dict(), dict(h=4, hk=4), dict(h=8, hk=1), dict(d=16), dict(d=128),
               dict(dtype=torch.float16), dict(seqlens_q=(0, 0), seqlens_k=(3, 4)),
               dict(seqlens_q=(1,), seqlens_k=(1,)), dict(seqlens_q=(7, 2), seqlens_k=(0, 0))):
        with pytest.raises(ValueError, match=CUDA):
            dash_cuda.attention_varlen(*call(**kw))
    args = call()
    with pytest.raises(ValueError, match=CUDA):  # a larger max_seqlen is allowed
        dash_cuda.attention_varlen(*args[:5], 1000, 1000, causal=True, schedule="lpt")
    with pytest.raises(ValueError, match=CUDA):  # one tensor for both offsets
        dash_cuda.attention_varlen(args[0], args[0], args[0], args[3], args[3], 37, 37)
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.flash_attn_varlen_func(*args, causal=True, deterministic=True)
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.attention_varlen_forward(*args)
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.attention_varlen_backward(**backward_call(), audit=True, exact=True)


def test_an_empty_batch_reaches_the_device_check():
    q, k = rand(0, 2, 32), rand(0, 2, 32)
    zero = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.attention_varlen(q, k, k, zero, zero, 0, 0)


def test_nothing_is_compiled_or_launched_for_rejected_input():
    code = (
        "import sys, torch, dash_cuda\n"
        "q = torch.randn(9, 2, 64).bfloat16()\n"
        "cu = torch.tensor([0, 4, 9], dtype=torch.int32)\n"
        "for bad in (cu.long(), torch.tensor([0, 4, 8], dtype=torch.int32), cu):\n"
        "    try:\n"
        "        dash_cuda.attention_varlen(q, q, q, bad, cu, 5, 5)\n"
        "    except (TypeError, ValueError):\n"
        "        pass\n"
        "loaded = [m for m in sys.modules if m in ('triton', 'cutlass', 'dash_cuda.prepost')\n"
        "          or m.endswith(('_kernel', '.launch')) and m.startswith('dash_cuda.backends')]\n"
        "assert not loaded, loaded\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def _with(index: int, value):
    args = call()
    args[index] = value
    return args


def _offset_cases():
    """(arguments, error type, words of the message)"""
    cu_q, cu_k = offsets(SEQLENS_Q), offsets(SEQLENS_K)
    return [
        # the offsets' dtype, type, rank and length
        (_with(3, cu_q.long()), TypeError, "cu_seqlens_q must be int32"),
        (_with(4, cu_k.float()), TypeError, "cu_seqlens_k must be int32"),
        (_with(3, cu_q.tolist()), TypeError, "cu_seqlens_q must be a torch.Tensor"),
        (_with(3, cu_q[None]), ValueError, "cu_seqlens_q must have 1 dim"),
        (_with(4, torch.zeros(0, dtype=torch.int32)), ValueError, "cu_seqlens_k must have 1 dim"),
        (_with(4, cu_k[:-1]), ValueError, "cu_seqlens_q has 5 offsets, cu_seqlens_k 4"),
        # their values
        (_with(3, cu_q + 1), ValueError, "cu_seqlens_q must start at 0, got cu_seqlens_q[0] = 1"),
        (_with(4, torch.tensor([0, 9, 30, 12, 48], dtype=torch.int32)), ValueError,
         "cu_seqlens_k must be non-decreasing, got cu_seqlens_k[3] = 12 < cu_seqlens_k[2] = 30"),
        (_with(3, torch.tensor([0, 5, 5, 42, 57], dtype=torch.int32)), ValueError,
         "cu_seqlens_q must end at the 58 rows of q, got cu_seqlens_q[-1] = 57"),
        (_with(4, torch.tensor([0, 9, 12, 32, 50], dtype=torch.int32)), ValueError,
         "cu_seqlens_k must end at the 48 rows of k and v, got cu_seqlens_k[-1] = 50"),
        # max_seqlen
        (_with(5, 36), ValueError, "max_seqlen_q=36 is smaller than sequence 2, of 37 rows"),
        (_with(6, 19), ValueError, "max_seqlen_k=19 is smaller than sequence 2, of 20 rows"),
        (_with(5, -1), ValueError, "max_seqlen_q must be an int >= 0, got -1"),
        (_with(6, 20.0), ValueError, "max_seqlen_k must be an int >= 0, got 20.0"),
        (_with(5, True), ValueError, "max_seqlen_q must be an int >= 0, got True"),
        # devices: the offsets with the tensors
        (_with(4, cu_k.to("meta")), ValueError, "all tensors must be on one device"),
    ]


@pytest.mark.parametrize("index", range(len(_offset_cases())))
def test_bad_offsets_are_refused_by_name(index):
    args, error, words = _offset_cases()[index]
    with pytest.raises(error) as info:
        dash_cuda.attention_varlen(*args)
    assert words in one_line(info)


def _tensor_cases():
    q, k, v, *rest = call()
    return [
        ((q[None], k, v), ValueError, "q must have 3 dims (total_q, H, d)"),
        ((q, k[..., 0], v), ValueError, "k must have 3 dims (total_k, H_kv, d)"),
        ((q.float(), k.float(), v.float()), TypeError, "q must be bfloat16 or float16"),
        ((q, k.half(), v), TypeError, "k has dtype torch.float16, q has torch.bfloat16"),
        ((q, k, v[:, :1]), ValueError, "k and v must have the same rows and heads"),
        ((q, rand(48, 2, 64), rand(48, 2, 64)), ValueError, "must share the head dim"),
        ((rand(58, 4, 48), rand(48, 2, 48), rand(48, 2, 48)), ValueError, "head dim 48"),
        ((rand(58, 3, 32), k, v), ValueError, "query heads (3) must be a multiple"),
        ((q, rand(48, 0, 32), rand(48, 0, 32)), ValueError, "at least one head"),
        ((rand(58, 4, 64)[..., ::2], k, v), ValueError, "contiguous in its last dim"),
        ((q, "k", v), TypeError, "k must be a torch.Tensor"),
        ((q, k, v[:47]), ValueError, "k and v must have the same rows and heads"),
    ]


@pytest.mark.parametrize("index", range(len(_tensor_cases())))
def test_bad_tensors_are_refused_by_name(index):
    tensors, error, words = _tensor_cases()[index]
    with pytest.raises(error) as info:
        dash_cuda.attention_varlen(*tensors, *call()[3:])
    assert words in one_line(info)


def test_rows_beyond_32_bit_offsets_are_refused():
    # meta tensors: shapes and strides without memory (refused before the values are read)
    q = torch.empty(2**20, 32, 128, dtype=torch.bfloat16, device="meta")
    cu = torch.tensor([0, 2**20], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="q is too long: its 1048576 packed rows"):
        dash_cuda.attention_varlen(q, q, q, cu, cu, 2**20, 2**20)
    k = torch.empty(2**17, 2, 128, dtype=torch.bfloat16, device="meta")
    q = torch.empty(2**17, 128, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="k is too long for GQA"):
        dash_cuda.attention_varlen(q, k, k, cu, cu, 2**17, 2**17)


def test_backward_tensors_are_checked():
    args = backward_call()
    args["lse"] = args["lse"].double()
    with pytest.raises(ValueError, match=r"lse must be float32 of shape \(58, 4\)"):
        dash_cuda.attention_varlen_backward(**args)
    args = backward_call()
    args["lse"] = args["lse"].t()  # (H, total_q): FlashAttention's softmax_lse layout
    with pytest.raises(ValueError, match="packed \\(total_q, H\\) layout"):
        dash_cuda.attention_varlen_backward(**args)
    args = backward_call()
    args["do"] = args["do"][:-1]
    with pytest.raises(ValueError, match="do must have the shape of q"):
        dash_cuda.attention_varlen_backward(**args)
    args = backward_call()
    args["o"] = args["o"].half()
    with pytest.raises(TypeError, match="o has dtype torch.float16"):
        dash_cuda.attention_varlen_backward(**args)
    with pytest.raises(TypeError, match="audit must be a bool"):
        dash_cuda.attention_varlen_backward(**backward_call(), audit=1)


@pytest.mark.parametrize("options, error, words", [
    (dict(schedule="fastest"), ValueError, "unknown schedule 'fastest'"),
    (dict(schedule="atomic"), ValueError, "deterministic=False"),
    (dict(schedule="shift", portable=True), ValueError, "portable=True takes"),
    (dict(num_workers=0), ValueError, "num_workers"),
    (dict(softmax_scale=float("inf")), ValueError, "softmax_scale"),
    (dict(exact=True, deterministic=False), ValueError, "exact=True"),
    (dict(backend="flash"), ValueError, "unknown backend 'flash'"),
    (dict(causal=1), TypeError, "causal must be a bool"),
])
def test_bad_options(options, error, words):
    with pytest.raises(error) as info:
        dash_cuda.attention_varlen(*call(), **options)
    assert words in one_line(info)


def test_ragged_schedules_are_taken_by_varlen_calls_only():
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.attention_varlen(*call(), schedule="lpt", portable=True)
    q = rand(2, 9, 2, 32)
    with pytest.raises(ValueError, match="unknown schedule 'lpt'"):
        dash_cuda.attention(q, q, q, schedule="lpt")


@pytest.mark.parametrize("option, value", [
    ("dropout_p", 0.1),
    ("alibi_slopes", torch.ones(4)), ("return_attn_probs", True),
    ("block_table", torch.zeros(2, 2, dtype=torch.int32)),
])
def test_flash_attn_options_beyond_dash_are_refused_by_name(option, value):
    with pytest.raises(ValueError) as info:
        dash_cuda.flash_attn_varlen_func(*call(), **{option: value})
    text = one_line(info)
    assert text.startswith("flash_attn_varlen_func:") and f"{option}=" in text


def test_flash_attn_names_every_unsupported_option_at_once():
    with pytest.raises(ValueError) as info:
        dash_cuda.flash_attn_varlen_func(*call(), 0.1, None, True, (64, 64), 30.0, None, True,
                                         True)
    text = one_line(info)
    assert "dropout_p=0.1" in text and "return_attn_probs=True" in text
    assert "window_size" not in text and "softcap" not in text  # both taken (and passed on)


def test_flash_attn_takes_its_own_argument_order():
    """FlashAttention's positional order (dropout_p, softmax_scale, causal), its defaults, and
    DASH's options as keywords."""
    import inspect

    names = list(inspect.signature(dash_cuda.flash_attn_varlen_func).parameters)
    assert names[:16] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                          "max_seqlen_k", "dropout_p", "softmax_scale", "causal", "window_size",
                          "softcap", "alibi_slopes", "deterministic", "return_attn_probs",
                          "block_table"]
    with pytest.raises(ValueError, match=CUDA):
        dash_cuda.flash_attn_varlen_func(*call(), 0.0, 0.2, True, (-1, -1), 0.0, None, True,
                                         False, None, schedule="lpt", portable=True)


def test_packed_calls_go_to_the_backend_that_runs_them():
    """CuTe runs packed calls while its switch ``PACKED_BACKWARD`` is on (``auto`` then
    picks it where CuTe DSL is installed), and refuses them in one line otherwise; packed
    ``exact=True`` calls always go to Triton."""
    from dash_cuda.backends import Case, choose_backend, get_backend
    from dash_cuda.backends.cute import PACKED_BACKWARD

    case = Case(64, torch.bfloat16, exact=False, deterministic=True, packed=True)
    reason = get_backend("cute").unsupported(case)
    assert get_backend("triton").unsupported(case) is None
    if PACKED_BACKWARD:
        assert reason is None
    else:
        assert reason and "\n" not in reason and "packed" in reason
    exact = Case(64, torch.bfloat16, exact=True, deterministic=True, packed=True)
    if get_backend("triton").missing() is None:
        assert choose_backend("auto", exact).name == "triton"
        cute_runs = PACKED_BACKWARD and get_backend("cute").missing() is None
        assert choose_backend("auto", case).name == ("cute" if cute_runs else "triton")
        if not PACKED_BACKWARD:
            with pytest.raises(ValueError, match="backend 'cute' cannot run this call"):
                choose_backend("cute", case)
