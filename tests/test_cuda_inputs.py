"""dash_cuda rejects bad input with a clear error before it compiles or launches anything.

These run on the CPU: every check happens before anything needs CUDA or Triton. A valid
call on CPU tensors gets as far as the device check, which proves that the structural
checks accept it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dash_cuda

GEN = torch.Generator().manual_seed(20260430)


def rand(*shape, dtype=torch.bfloat16, device="cpu"):
    x = torch.randn(*shape, generator=GEN).to(dtype)
    return x.to(device) if device != "cpu" else x


def qkv(b=2, h=4, hk=2, sq=33, sk=47, d=64, dtype=torch.bfloat16):
    return rand(b, sq, h, d, dtype=dtype), rand(b, sk, hk, d, dtype=dtype), rand(
        b, sk, hk, d, dtype=dtype)


def backward_args(**kw):
    q, k, v = qkv(**kw)
    b, sq, h, _ = q.shape
    return dict(q=q, k=k, v=v, o=rand(*q.shape, dtype=q.dtype),
                lse=torch.randn(b, sq, h, generator=GEN), do=rand(*q.shape, dtype=q.dtype))


def test_valid_cpu_inputs_reach_the_device_check():
    for shape in (dict(), dict(h=8, hk=1), dict(sq=1, sk=1000), dict(d=128), dict(d=32),
                  dict(sq=0), dict(sk=0), dict(b=0)):
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            dash_cuda.attention(*qkv(**shape))
    q, k, v = qkv()
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            layout="bhsd", causal=True)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.attention_backward(**backward_args(), schedule="shift", num_workers=7)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.attention_forward(*qkv(dtype=torch.float16))


def test_nothing_is_compiled_or_launched_for_rejected_input():
    # a fresh interpreter: other tests of the session may have loaded the kernels already
    code = (
        "import sys, torch, dash_cuda\n"
        "q = torch.randn(1, 9, 2, 64).bfloat16()\n"
        "try:\n"
        "    dash_cuda.attention(q, q, q)\n"
        "except ValueError as e:\n"
        "    assert 'needs CUDA tensors' in str(e), e\n"
        "loaded = [m for m in sys.modules if m in ('triton', 'cutlass', 'dash_cuda.prepost')\n"
        "          or m.endswith(('_kernel', '.launch')) and m.startswith('dash_cuda.backends')]\n"
        "assert not loaded, loaded\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr


def test_mismatched_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        dash_cuda.attention(q, k.to("meta"), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_unsupported_dtype(dtype):
    q, k, v = qkv()
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        dash_cuda.attention(q.to(dtype), k.to(dtype), v.to(dtype))


def test_mismatched_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="must match"):
        dash_cuda.attention(q, k.half(), v)
    args = backward_args()
    args["do"] = args["do"].half()
    with pytest.raises(TypeError, match="must match"):
        dash_cuda.attention_backward(**args)


@pytest.mark.parametrize("shape", [(2, 33, 64), (1, 2, 33, 4, 64), (64,)])
def test_wrong_rank(shape):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="4 dims"):
        dash_cuda.attention(rand(*shape), k, v)


@pytest.mark.parametrize("d", [8, 48, 80, 160, 512])
def test_unsupported_head_dim(d):
    with pytest.raises(ValueError, match="head dim"):
        dash_cuda.attention(*qkv(d=d))


def test_head_dims_differ():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="share batch and head dim"):
        dash_cuda.attention(q, rand(2, 47, 2, 128), rand(2, 47, 2, 128))
    with pytest.raises(ValueError, match="share batch and head dim"):
        dash_cuda.attention(q, rand(3, 47, 2, 64), rand(3, 47, 2, 64))


def test_k_and_v_differ():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k and v"):
        dash_cuda.attention(q, k, rand(2, 48, 2, 64))


@pytest.mark.parametrize("heads", [(4, 3), (6, 4), (3, 2)])
def test_heads_not_a_multiple(heads):
    h, hk = heads
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        dash_cuda.attention(*qkv(h=h, hk=hk))


def test_layout_is_checked_in_its_own_order():
    q, k, v = qkv(h=4, hk=2)
    # read as (B, H, S, d) these have 33 query heads and 47 key heads
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        dash_cuda.attention(q, k, v, layout="bhsd")
    with pytest.raises(ValueError, match="layout"):
        dash_cuda.attention(q, k, v, layout="sbhd")


def test_non_contiguous_last_dim():
    q, k, v = qkv()
    strided = rand(2, 33, 4, 128)[..., ::2]
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        dash_cuda.attention(strided, k, v)
    with pytest.raises(ValueError, match="contiguous in its last dim"):
        dash_cuda.attention(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v)


def test_sequences_beyond_32_bit_offsets_are_refused():
    # meta tensors: shapes and strides without memory
    q = torch.empty(1, 2**20, 32, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="too long"):
        dash_cuda.attention(q, q, q)


def test_backward_tensors_are_checked():
    args = backward_args()
    args["lse"] = args["lse"].double()
    with pytest.raises(ValueError, match="lse must be float32"):
        dash_cuda.attention_backward(**args)
    args = backward_args()
    args["lse"] = args["lse"].transpose(1, 2)  # (B, H, S_q) is the bhsd layout's shape
    with pytest.raises(ValueError, match="lse must be float32 of shape"):
        dash_cuda.attention_backward(**args)
    args = backward_args()
    args["do"] = args["do"][:, :-1]
    with pytest.raises(ValueError, match="do must have the shape of q"):
        dash_cuda.attention_backward(**args)
    args = backward_args()
    args["o"] = "not a tensor"
    with pytest.raises(TypeError, match="o must be a torch.Tensor"):
        dash_cuda.attention_backward(**args)


@pytest.mark.parametrize("options, match", [
    (dict(schedule="fastest"), "unknown schedule"),
    (dict(schedule="atomic"), "deterministic=False"),
    (dict(num_workers=0), "num_workers"),
    (dict(num_workers=-3), "num_workers"),
    (dict(num_workers=2.5), "num_workers"),
    (dict(num_workers=True), "num_workers"),
    (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(softmax_scale="0.1"), "softmax_scale"),
    (dict(exact=True, deterministic=False), "exact=True"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        dash_cuda.attention(*qkv(), **options)


def test_bad_causal_flag():
    with pytest.raises(TypeError, match="causal"):
        dash_cuda.attention(*qkv(), causal=1)


def test_bad_exact_flag():
    with pytest.raises(TypeError, match="exact"):
        dash_cuda.attention(*qkv(), exact=1)
    with pytest.raises(ValueError, match="exact=True"):
        dash_cuda.attention_backward(**backward_args(), exact=True, deterministic=False)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.attention_backward(**backward_args(), exact=True, schedule="shift")
