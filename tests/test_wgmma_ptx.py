"""The wgmma validation kernels of ``scripts/validate_wgmma.py``, on the CPU.

Exports three variants (``--export``'s path: compile for sm_90a, keep the PTX, write the
AOT object) and checks their PTX: the ``wgmma.mma_async.sync.aligned.m64nNk16`` opcode of
the dtype, K / 16 of them, A as a register list or a descriptor, the transpose immediates
and scale-d. Then the register A's layout against CuTe's ``partition_A`` (with a negative
control), and the comparison plumbing (``--self-test``: the model's own outputs give 0
mismatches, one flipped bit 1). The GPU run itself is ``validate_wgmma.py --aot DIR``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import validate_wgmma  # noqa: E402
import wgmma_kernel  # noqa: E402
from wgmma_kernel import WgmmaVariant  # noqa: E402

VARIANTS = [
    WgmmaVariant("ss_kk", 128, 64, "bf16", load_c=False),  # S = Q K^T: fresh accumulator
    WgmmaVariant("rs_mn", 64, 128, "fp16", load_c=True),  # acc += P V at d = 64
    WgmmaVariant("ss_mn", 64, 16, "bf16", load_c=False),  # dQ = dS K, one k16 block
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``--export`` of VARIANTS into a fresh folder: (folder, manifest, {name: PTX})."""
    folder = tmp_path_factory.mktemp("wgmma_aot")
    assert validate_wgmma.export_all(VARIANTS, str(folder), jobs=1) == 0
    manifest = json.loads((folder / validate_wgmma.MANIFEST).read_text())
    ptx = {v.name: next((folder / "ptx" / v.name).glob("*.ptx")).read_text() for v in VARIANTS}
    return folder, manifest, ptx


def test_every_variant_is_exported(exported):
    folder, manifest, _ = exported
    for v in VARIANTS:
        assert (folder / f"{v.name}.o").stat().st_size > 0
    rows = {r["name"]: r for r in manifest["variants"]}
    assert all(rows[v.name]["ptx_ok"] for v in VARIANTS), manifest
    assert manifest["register_a_check"] == {"128": []}


@pytest.mark.parametrize("v", VARIANTS, ids=lambda v: v.name)
def test_ptx_has_the_expected_wgmma(v, exported):
    ptx = exported[2][v.name]
    assert validate_wgmma.check_ptx(ptx, v) == []
    t = "bf16" if v.dtype == "bf16" else "f16"
    opcode = f"wgmma.mma_async.sync.aligned.m64n{v.n}k16.f32.{t}.{t}"
    lines = [ln for ln in ptx.splitlines() if "wgmma.mma_async" in ln]
    assert len(lines) == v.k // 16
    assert all(ln.split()[0] == opcode for ln in lines)
    for ln in lines:
        after_acc = ln.split("}", 1)[1]  # what follows the accumulator list
        if v.a_in_registers:  # {a0, a1, a2, a3}, the B descriptor, p, 1, 1, tnspB
            assert re.match(r",\s*\{%r\d+, %r\d+, %r\d+, %r\d+\},\s*%rd\d+,\s*p,\s*1,\s*1,"
                            r"\s*1;", after_acc), ln
        else:  # A and B descriptors, p, 1, 1, tnspA, tnspB
            ta, tb = int(v.transpose_a), int(v.transpose_b)
            assert re.match(rf",\s*%rd\d+,\s*%rd\d+,\s*p,\s*1,\s*1,\s*{ta},\s*{tb};",
                            after_acc), ln
    scale = [w["scale_d"] for w in validate_wgmma.wgmma_instructions(ptx)]
    assert scale == [int(v.load_c)] + [1] * (v.k // 16 - 1)


def test_ptx_check_catches_wrong_forms(exported):
    ptx = exported[2]
    ss, rs = VARIANTS[0], VARIANTS[1]
    # another variant's PTX: register A where a descriptor belongs, and the reverse
    assert validate_wgmma.check_ptx(ptx[rs.name], WgmmaVariant("ss_kk", 64, 128, "fp16", True))
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("rs_mn", 128, 64, "bf16", False))
    # the other dtype, another N, a missing k block, C switched on
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("ss_kk", 128, 64, "fp16", False))
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("ss_kk", 64, 64, "bf16", False))
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("ss_kk", 128, 128, "bf16", False))
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("ss_kk", 128, 64, "bf16", True))
    # K-major B read as MN-major
    assert validate_wgmma.check_ptx(ptx[ss.name], WgmmaVariant("ss_mn", 128, 64, "bf16", False))
    # an operand rounded on its way in
    assert validate_wgmma.check_ptx(ptx[rs.name].replace(
        "wgmma.fence.sync.aligned;", "cvt.rn.f16.f32 %rs9, %f9;\nwgmma.fence.sync.aligned;"), rs)


def test_register_a_catches_a_wrong_alias():
    """``register_a_check`` (passing in the export above) fails for an aliasing that swaps
    the two 16-bit halves of every register pair."""
    import cutlass.cute as cute

    def swapped(acc, dtype):
        op, view = wgmma_kernel.acc_as_operand_a(acc, dtype)
        shape = op.shape
        wrong = cute.make_layout(shape, stride=((2, 1, 4), 0, 8))
        return cute.make_tensor(op.iterator, wrong), view

    bad = wgmma_kernel.register_a_check(16, alias=swapped)
    assert len(bad) == wgmma_kernel.THREADS, bad[:3]


def test_self_test_counts_zero_then_one(tmp_path, capsys):
    assert validate_wgmma.main(["--self-test", "--out", str(tmp_path), "--jobs", "1"]) == 0
    report = json.loads((tmp_path / "validate_wgmma.json").read_text())
    assert report["self_test_failures"] == []
    assert report["total"]["mismatches"] == 1
    summary = (tmp_path / "summary.md").read_text()
    assert "first mismatches" in summary and "| 1 | 5 | 7 |" in summary
    assert "PASS" in capsys.readouterr().out


def test_without_cuda_exits_2(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert validate_wgmma.main(["--out", str(tmp_path), "--only", VARIANTS[0].name]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
