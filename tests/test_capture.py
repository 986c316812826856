"""Captures: a GPU run in one file, reproduced bit for bit on this CPU (L2 of the default).

``tests/data/captures/`` holds runs of the default CuTe forward and backward captured on an
H200 (``scripts/l2_matrix.py --keep``): both masks, both head dims, bf16 and fp16, grouped
queries, lengths that are not tile multiples. Each must be reproduced on every step by
``dash_ref``'s FAST arithmetic, and must stop being reproduced when one MUFU table entry
or one emulated step changes.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dash_ref import Problem, build_schedule
from dash_ref.arithmetic import mufu, steps
from dash_ref.emulate import backward, forward
from verify import capture as cap
from verify.cli import main
from verify.l2 import first_difference

CHANGE = 1 << 13  # ulps added to one table entry: one ulp is mostly lost in 16-bit roundings
CAPTURES = sorted((Path(__file__).parent / "data" / "captures").glob("*.capture"))


def synthetic(tmp_path: Path) -> Path:
    """A capture file whose "kernel" values are the FAST emulation's own (file plumbing)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, s, 2, 64, generator=gen).bfloat16()
                   for s in (40, 70, 70, 40))
    p = Problem(1, 2, 2, 40, 70, 64, "causal", 128, 128)
    sched = build_schedule(p, "descending", 2)
    fwd = forward(q, k, v, True, None, 128, 128, arithmetic="fast")
    bwd = backward(sched, q, k, v, fwd.o, fwd.lse2, do, return_partials=True,
                   arithmetic="fast")
    tensors = {"q": q, "k": k, "v": v, "do": do, "o": fwd.o, "lse2": fwd.lse2, "dq": bwd.dq,
               "dk": bwd.dk, "dv": bwd.dv, "delta": steps.delta(steps.FAST, fwd.o, do),
               "partials": cap._real_rows(bwd.partials, sched), "dq_acc": bwd.dq_acc,
               "dk_heads": bwd.dk_acc, "dv_heads": bwd.dv_acc}
    meta = {"format": cap.FORMAT, "causal": True, "softmax_scale": None,
            "schedule": "descending", "num_workers": 2, "fingerprint": sched.fingerprint(),
            "block_m": 128, "block_n": 128, "backend": "cute", "arithmetic": "fast",
            "flush_subnormals": False, "forward_block_n": 128, "environment": {}}
    path = tmp_path / "synthetic.capture"
    cap.save(cap.Capture(meta, tensors), path)
    return path


def test_a_capture_file_round_trips_and_reproduces(tmp_path):
    c = cap.load(synthetic(tmp_path))
    names = [name for name, _, _ in cap.check(c)]
    assert names == ["O", "LSE2", "D", "partials", "dq_acc", "dk_acc", "dv_acc", "dq", "dk",
                     "dv"]
    assert first_difference(cap.check(c)) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_a_damaged_file_is_refused_in_one_line(tmp_path, damage, capsys):
    path = synthetic(tmp_path)
    blob = bytearray(path.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "flip":
        blob[-100] ^= 1
    else:
        blob[:4] = b"XXXX"
    path.write_bytes(bytes(blob))
    with pytest.raises(cap.CaptureError):
        cap.load(path)
    assert main(["reproduce", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_changed_value_is_a_finding_that_names_the_step(tmp_path, capsys):
    path = synthetic(tmp_path)
    c = cap.load(path)
    bits = c.tensors["dq_acc"].view(torch.int32)
    bits.view(-1)[5] ^= 1  # one ulp in one accumulator
    cap.save(c, path)
    assert main(["reproduce", str(path)]) == 1
    out = capsys.readouterr().out
    assert "first differing step dq_acc, 1 of" in out


def test_capture_without_a_gpu_is_an_environment_error(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["capture", "--out", str(tmp_path / "x.capture")]) == 2
    assert "CUDA" in capsys.readouterr().err


# -- the H200's bits --------------------------------------------------------------------------
def test_the_committed_captures_cover_the_cases_the_proof_needs():
    metas = [cap.load(p) for p in CAPTURES]
    assert len(metas) >= 4
    assert {c.meta["causal"] for c in metas} == {False, True}
    assert {c.problem.head_dim for c in metas} == {64, 128}
    assert {c.tensors["q"].dtype for c in metas} == {torch.bfloat16, torch.float16}
    assert any(c.problem.group == 4 for c in metas)
    assert all("H200" in c.meta["environment"]["gpu"] for c in metas)
    assert any(c.problem.seqlen_q % c.problem.block_m and c.problem.seqlen_q != c.problem.seqlen_k
               for c in metas)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_the_cpu_reproduces_the_h200_bit_for_bit(path, capsys):
    assert main(["reproduce", str(path)]) == 0, capsys.readouterr().out


def _ex2_arguments(c: cap.Capture) -> torch.Tensor:
    """The arguments the run's exp2 steps see (recorded while reproducing it)."""
    seen = []
    model = steps.ex2_approx_ftz

    def recording(x, t=None):
        seen.append(x.reshape(-1).clone())
        return model(x, t)

    steps.ex2_approx_ftz = recording
    try:
        cap.check(c)
    finally:
        steps.ex2_approx_ftz = model
    return torch.cat(seen)


def test_one_changed_table_entry_breaks_the_reproduction():
    c = cap.load(CAPTURES[0])
    x = _ex2_arguments(c)
    x = x[(x < 0) & (x > -126)]
    entry = int(torch.bincount(((-x).double() * 2**23).floor().long() & 0x7FFFFF).argmax())
    t = mufu.tables()
    changed = t.ex2_neg.clone()
    changed[entry] += CHANGE
    with mufu.using(mufu.MufuTables(t.ex2_pos, changed, t.lg2_ge1, t.lg2_lt1, t.ex2_nan,
                                    t.lg2_nan)):
        assert first_difference(cap.check(c)) is not None


@pytest.mark.parametrize("step", ["correctly rounded exp2", "one sum over the row"])
def test_one_changed_step_breaks_the_reproduction(step, monkeypatch):
    c = cap.load(CAPTURES[0])
    if step == "correctly rounded exp2":
        def exp2(x, t=None):
            y = torch.exp2(x.double()).float()
            return torch.where(y < 2.0**-126, torch.zeros_like(y), y)
        monkeypatch.setattr(steps, "ex2_approx_ftz", exp2)
    else:  # the row's probabilities summed in one chain instead of four threads' partials
        def one_chain(p, block_n):
            return torch.nn.functional.pad(p.sum(1, keepdim=True), (0, 3))
        monkeypatch.setattr(steps, "quad_sums", one_chain)
    diff = first_difference(cap.check(c))
    assert diff is not None and diff[0] in ("O", "LSE2")


def test_the_mufu_models_match_their_special_cases():
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 128.0, -150.0])
    y = mufu.ex2_approx_ftz(x)
    assert y[:2].tolist() == [1.0, 1.0] and y[2] == math.inf and y[3] == 0.0
    assert y[4].isnan() and y[5:7].tolist() == [1.0, 1.0] and y[7] == math.inf and y[8] == 0.0
    z = mufu.lg2_approx_ftz(torch.tensor([1.0, 2.0, 0.5, 0.0, -0.0, 1e-40, -1.0, math.inf]))
    assert z[:2].tolist() == [0.0, 1.0] and (z[3:6] == -math.inf).all()
    assert z[2] == -1.0 + 2.0**-23  # MUFU.LG2(0.5) as measured: two fp32 ulps above -1
    assert z[6].isnan() and z[7] == math.inf


# -- FlashAttention's other options, captured from the Triton kernels in the interpreter ------
@pytest.fixture(scope="module")
def featured_capture(tmp_path_factory):
    """``verify.capture.capture`` of the Triton backend's ``exact=True`` run, in Triton's CPU
    interpreter with the GPU's rounding models: GQA, ``S_q != S_k``, a two-sided window, a
    value head dim of its own, a softcap and sinks."""
    pytest.importorskip("triton.runtime.interpreter")
    from triton_interpreter import run

    gen = torch.Generator().manual_seed(41)
    q, k, v, do = (torch.randn(*s, generator=gen).to(torch.bfloat16) * a for s, a in (
        ((1, 70, 2, 32), 4.0), ((1, 90, 1, 32), 1.0), ((1, 90, 1, 16), 1.0),
        ((1, 70, 2, 16), 1.0)))
    call = dict(kind="capture", q=q, k=k, v=v, do=do, kwargs=dict(
        causal=False, schedule="shift", num_workers=1, backend="triton", exact=True,
        window_size=(30, 12), softcap=20.0, learnable_sink=torch.tensor([1.5, -2.0])))
    (done,) = run([call], tmp_path_factory.mktemp("capture"), hopper=True)
    path = tmp_path_factory.mktemp("file") / "featured.capture"
    cap.save(cap.Capture(done["out"]["meta"], done["out"]["tensors"]), path)
    return path


def test_a_capture_with_every_option_round_trips_and_reproduces(featured_capture, capsys):
    c = cap.load(featured_capture)
    p = c.problem
    assert (p.window_size, p.head_dim_v, p.group) == ((30, 12), 16, 2)
    assert c.softcap == 20.0 and torch.equal(c.learnable_sink, torch.tensor([1.5, -2.0]))
    assert "d_v=16 window=(30, 12) softcap=20 sinks" in c.describe()
    steps_ = cap.check(c)
    assert steps_[-1][0] == "dsink" and first_difference(steps_) is None
    assert main(["reproduce", str(featured_capture)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("change", ["no softcap", "another sink", "no window"])
def test_a_capture_with_a_changed_option_no_longer_reproduces(featured_capture, tmp_path,
                                                               change):
    """Each option is read back and used: changed, the CPU computes other bits (a sink
    logit: ``dsink``; the backward's other steps do not depend on the sinks, LSE2 carries
    them) or, for the window, another schedule, whose fingerprint is refused."""
    c = cap.load(featured_capture)
    if change == "no softcap":
        c.meta["softcap"] = 0.0
    elif change == "another sink":
        c.tensors["learnable_sink"] = c.tensors["learnable_sink"] + torch.tensor([0.0, 0.5])
    else:
        c.meta["window_size"] = None
    cap.save(c, tmp_path / "x.capture")
    changed = cap.load(tmp_path / "x.capture")
    try:
        diff = first_difference(cap.check(changed))
    except cap.CaptureError as exc:
        assert change == "no window" and "fingerprint" in str(exc)
    else:
        assert diff is not None
        assert change != "another sink" or diff[0] == "dsink"


def test_sinks_without_their_gradient_are_refused(featured_capture, tmp_path):
    c = cap.load(featured_capture)
    del c.tensors["dsink"]
    cap.save(c, tmp_path / "x.capture")
    with pytest.raises(cap.CaptureError, match="tensors missing: dsink"):
        cap.load(tmp_path / "x.capture")


@pytest.fixture(scope="module")
def packed_capture(tmp_path_factory):
    """A packed batch captured from the Triton ``exact=True`` run in the interpreter: an
    empty sequence, ``S_q != S_k`` per sequence, GQA, causal, a softcap and sinks."""
    pytest.importorskip("triton.runtime.interpreter")
    from triton_interpreter import run

    from dash_ref import Problem
    from verify.impls import packing_of

    p = Problem.packed((37, 0, 64, 20), (50, 12, 64, 9), 2, 1, 16, "causal")
    gen = torch.Generator().manual_seed(43)
    q, k, v, do = (torch.randn(rows, h, 16, generator=gen).to(torch.bfloat16)
                   for rows, h in ((p.total_q, 2), (p.total_k, 1), (p.total_k, 1),
                                   (p.total_q, 2)))
    call = dict(kind="capture", q=q * 4, k=k, v=v, do=do, kwargs=dict(
        causal=True, schedule="lpt", num_workers=1, backend="triton", exact=True,
        softcap=20.0, learnable_sink=torch.tensor([0.5, -3.0]),
        packing=packing_of(p, "cpu")))
    (done,) = run([call], tmp_path_factory.mktemp("packed"), hopper=True)
    path = tmp_path_factory.mktemp("file") / "packed.capture"
    cap.save(cap.Capture(done["out"]["meta"], done["out"]["tensors"]), path)
    return path


def test_a_packed_capture_round_trips_and_reproduces(packed_capture, tmp_path, capsys):
    c = cap.load(packed_capture)
    p = c.problem
    assert p.is_packed and (p.seqlens_q, p.seqlens_k) == ((37, 0, 64, 20), (50, 12, 64, 9))
    assert "packed (37, 0, 64, 20) / (50, 12, 64, 9)" in c.describe()
    steps_ = cap.check(c)
    assert steps_[-1][0] == "dsink" and first_difference(steps_) is None
    assert main(["reproduce", str(packed_capture)]) == 0, capsys.readouterr().out
    # other offsets over the same rows: another problem, another schedule
    c.tensors["cu_seqlens_q"] = torch.tensor([0, 30, 37, 101, 121], dtype=torch.int32)
    cap.save(c, tmp_path / "x.capture")
    with pytest.raises(cap.CaptureError, match="fingerprint"):
        cap.check(cap.load(tmp_path / "x.capture"))
    del c.tensors["cu_seqlens_k"]
    cap.save(c, tmp_path / "y.capture")
    with pytest.raises(cap.CaptureError, match="tensors missing: cu_seqlens_k"):
        cap.load(tmp_path / "y.capture")


def test_the_capture_flags_draw_the_inputs_they_name():
    """``dash-verify capture``'s inputs (drawn on the CPU here): packed rows and offsets from
    ``--seqlens-q`` / ``--seqlens-k``, the value head dim, one sink per head; rectangular
    draws keep their order (q, dO, k, v), so a seed gives what it gave before."""
    from verify.cli import build_parser
    from verify.cli.capture import inputs_from_args

    def drawn(*flags):
        args = build_parser().parse_args(["capture", "--out", "x", *flags])
        return inputs_from_args(args, "cpu")

    q, k, v, do, sink, packing = drawn("--seqlens-q", "5,0,7", "--seqlens-k", "4,3,9",
                                       "--heads", "4", "--heads-kv", "2", "--head-dim", "64",
                                       "--head-dim-v", "32", "--learnable-sink=1,-2,0.5,3")
    assert (q.shape, k.shape, v.shape, do.shape) == ((12, 4, 64), (16, 2, 64), (16, 2, 32),
                                                     (12, 4, 32))
    assert packing["cu_seqlens_q"].tolist() == [0, 5, 5, 12]
    assert packing["cu_seqlens_k"].tolist() == [0, 4, 7, 16]
    assert (packing["max_seqlen_q"], packing["max_seqlen_k"]) == (7, 9)
    assert sink.tolist() == [1.0, -2.0, 0.5, 3.0] and sink.dtype == torch.float32
    q, k, v, do, sink, packing = drawn("--seqlen-q", "20", "--seqlen-k", "30", "--seed", "7")
    gen = torch.Generator().manual_seed(7)
    want = [torch.randn(*s, generator=gen).bfloat16()
            for s in ((1, 20, 2, 64), (1, 20, 2, 64), (1, 30, 2, 64), (1, 30, 2, 64))]
    for got, ref in zip((q, do, k, v), want):
        assert torch.equal(got, ref)
    assert sink is None and packing is None
    with pytest.raises(ValueError, match="3 logits, --heads 2"):
        drawn("--learnable-sink=1,2,3")
