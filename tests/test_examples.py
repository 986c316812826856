"""The reproducible-training example's harness, on the CPU with PyTorch's math attention."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

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
    a = {"losses": [2.0, 1.5, 1.25], "weights": "x", "tokens_per_s": 1.0, "step_ms": [1.0]}
    b = {"losses": [2.0, 1.5000001, 1.25], "weights": "y", "tokens_per_s": 1.0,
         "step_ms": [1.0]}
    row = example.compare("sdpa-math", [a, b])
    assert row["loss_equal"] == [True, False, True]
    assert row["first_differing_step"] == 1 and not row["weights_equal"]


def test_no_gpu_is_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert example.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--segment", "0"], ["--steps", "1"]])
def test_no_timed_turn_is_exit_2(flags, capsys, tmp_path):
    assert example.main(["--device", "cpu", "--out", str(tmp_path), *flags]) == 2
    assert "the first turn warms up" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_attention_that_did_not_run_is_reported_not_dropped():
    run = {"losses": [2.0, 1.5], "weights": "w", "tokens_per_s": 4.0, "step_ms": [3.0, 5.0]}
    ok = example.compare("dash", [run, run])
    report = {"environment": "test", "command": "x", "results": [
        ok, {"attention": "sdpa-flash-det", "error": "no deterministic backward"}],
        "config": {"layers": 1, "d_model": 8, "heads": 2, "seqlen": 4, "batch": 1, "steps": 2}}
    text = example.markdown(report)
    assert "| sdpa-flash-det | did not run: no deterministic backward |" in text
    assert "- dash: 1.00 (1.00 - 1.00)" in text and "- sdpa-flash-det" not in text


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


def _recording_advance(log: list, fail: str | None = None):
    def advance(run, cfg, data, device, steps):
        if run.attention == fail:
            raise RuntimeError("strict determinism refused\nsecond line")
        log.append((run.attention, id(run), list(steps)))
        run.losses.extend(0.0 for _ in steps)
        return 1e-3 * len(steps)
    return advance


def test_runs_take_turns_in_a_rotating_order(monkeypatch):
    log = []
    monkeypatch.setattr(example, "advance", _recording_advance(log))
    cfg = example.Config(layers=1, d_model=8, heads=2, seqlen=4, vocab=16, batch=1, steps=25)
    runs, errors = example.train_interleaved(cfg, ["sdpa-math", "sdpa-cudnn"], None,
                                             torch.device("cpu"), segment=10, log=lambda line: None)
    assert errors == {} and [len(r) for r in runs.values()] == [2, 2]
    order = [id(r) for pair in zip(*runs.values()) for r in pair]  # run 1s, then run 2s
    turns = [log[i:i + 4] for i in range(0, len(log), 4)]
    assert [t[0][2] for t in turns] == [list(range(0, 10)), list(range(10, 20)),
                                        list(range(20, 25))]
    for n, turn in enumerate(turns):
        assert [run for _, run, _ in turn] == order[n:] + order[:n]  # each run once, rotated
        assert all(steps == turn[0][2] for _, _, steps in turn)
    for run in (r for pair in runs.values() for r in pair):
        assert run.steps == [10, 5] and len(run.losses) == 25  # the first turn is not timed


def test_an_attention_whose_step_raises_stops_and_says_why(monkeypatch):
    log = []
    monkeypatch.setattr(example, "advance", _recording_advance(log, fail="sdpa-flash-det"))
    cfg = example.Config(layers=1, d_model=8, heads=2, seqlen=4, vocab=16, batch=1, steps=6)
    runs, errors = example.train_interleaved(cfg, ["sdpa-math", "sdpa-flash-det"], None,
                                             torch.device("cpu"), segment=2, log=lambda line: None)
    assert errors == {"sdpa-flash-det": "strict determinism refused"}
    assert list(runs) == ["sdpa-math"] and {a for a, _, _ in log} == {"sdpa-math"}
    assert len(log) == 2 * 3  # two runs, three turns each


def test_taking_turns_changes_no_bit_of_a_run():
    cfg = example.Config(layers=1, d_model=32, heads=2, seqlen=16, vocab=64, batch=2, steps=6)
    data = example.bigram_data(cfg)
    alone = example.new_run(cfg, "sdpa-math", torch.device("cpu"))
    example.advance(alone, cfg, data, torch.device("cpu"), range(cfg.steps))
    runs, _ = example.train_interleaved(cfg, ["sdpa-math"], data, torch.device("cpu"),
                                        segment=2, log=lambda line: None)
    for run in runs["sdpa-math"]:
        assert run.losses == alone.losses
        assert example.weights_digest(run.model) == example.weights_digest(alone.model)


def test_speed_ratios_are_taken_within_each_turn():
    def row(name, ms1, ms2):
        run = {"losses": [1.0], "weights": "w", "tokens_per_s": 1.0}
        return example.compare(name, [{**run, "step_ms": ms1}, {**run, "step_ms": ms2}])
    # the machine slows down in the second turn; both rows see it
    dash = row("dash", [10.0, 20.0, 10.0], [10.0, 20.0, 10.0])
    peer = row("sdpa-cudnn", [11.0, 24.0, 10.0], [11.0, 24.0, 12.0])
    assert example.turn_ratios(peer, dash) == pytest.approx([1.1, 1.2, 1.1])
    report = {"environment": "test", "command": "x", "segment": 10, "results": [dash, peer],
              "config": {"layers": 1, "d_model": 8, "heads": 2, "seqlen": 4, "batch": 1,
                         "steps": 2}}
    text = example.markdown(report)
    assert "- sdpa-cudnn: 1.10 (1.10 - 1.20)" in text
    assert "median over 3 turns" in text and "| 11.00 |" in text  # the peer's median turn
