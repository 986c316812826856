"""The reproducible-training example's harness, on the CPU with PyTorch's math attention."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import reproducible_training as example  # noqa: E402


def test_two_cpu_runs_agree_and_the_report_says_so(tmp_path):
    argv = ["--out", str(tmp_path), "--device", "cpu", "--attention", "sdpa-math",
            "--layers", "1", "--d-model", "32", "--heads", "2", "--seqlen", "16",
            "--vocab", "64", "--batch", "2", "--steps", "8"]
    assert example.main(argv) == 0
    report = json.loads((tmp_path / "reproducible_training.json").read_text())
    (row,) = report["results"]
    assert len(row["loss_run1"]) == 8 and row["all_losses_equal"] and row["weights_equal"]
    assert row["loss_run1"][-1] < row["loss_run1"][0]  # it learns the bigram stream
    assert (tmp_path / "reproducible_training.png").stat().st_size > 0
    assert "8 / 8" in (tmp_path / "reproducible_training.md").read_text()


def test_a_changed_run_is_reported_as_different():
    a = {"losses": [2.0, 1.5, 1.25], "weights": "x", "tokens_per_s": 1.0}
    b = {"losses": [2.0, 1.5000001, 1.25], "weights": "y", "tokens_per_s": 1.0}
    row = example.compare("sdpa-math", [a, b])
    assert row["loss_equal"] == [True, False, True]
    assert row["first_differing_step"] == 1 and not row["weights_equal"]


def test_no_gpu_is_exit_2(capsys):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert example.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_an_attention_that_did_not_run_is_reported_not_dropped():
    ok = example.compare("dash", [{"losses": [2.0, 1.5], "weights": "w", "tokens_per_s": 4.0},
                                  {"losses": [2.0, 1.5], "weights": "w", "tokens_per_s": 4.0}])
    report = {"environment": "test", "command": "x", "results": [
        ok, {"attention": "sdpa-flash-det", "error": "no deterministic backward"}],
        "config": {"layers": 1, "d_model": 8, "heads": 2, "seqlen": 4, "batch": 1, "steps": 2}}
    text = example.markdown(report)
    assert "| sdpa-flash-det | did not run: no deterministic backward |" in text
    assert "- dash: 1.00" in text and "- sdpa-flash-det" not in text


def test_cpu_defaults_train_a_tiny_model_into_a_scratch_folder(tmp_path, monkeypatch, capsys):
    import tempfile
    import time

    committed = ROOT / "benchmarks" / "results" / "reproducible_training.json"
    before = committed.read_bytes()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    start = time.perf_counter()
    assert example.main(["--device", "cpu"]) == 0
    assert time.perf_counter() - start < 60
    (scratch,) = tmp_path.glob("reproducible_training-*")
    report = json.loads((scratch / "reproducible_training.json").read_text())
    assert report["config"] == {**example.CPU_CONFIG.__dict__}
    assert [r["attention"] for r in report["results"]] == ["sdpa-math"]
    assert committed.read_bytes() == before  # the committed H200 results are left alone
    out = capsys.readouterr().out
    assert out.startswith("training 2 layers") and str(scratch) in out


def test_attention_dominates_the_large_preset_and_not_the_small_one():
    # per token and layer: causal attention 3.5 * 2 * S * d_model, the weights 72 * d_model^2
    small, large = example.Config(), example.LARGE_CONFIG
    assert example.attention_share(small) < 0.25 < 0.5 < example.attention_share(large)
    assert large.d_model // large.heads == 128
    # one layer, no head: attention equals the weights where 7 * S = 72 * d_model
    assert example.attention_share(example.Config(layers=1, d_model=7, seqlen=72, vocab=0,
                                                  heads=1)) == 0.5
