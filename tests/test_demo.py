"""The CPU demo (the project's main job) runs end to end and says true things."""

from __future__ import annotations

from dash_ref import NAMES
from verify.cli import main
from verify.demo import run_demo


def test_demo_rows_and_trace():
    lines: list[str] = []
    out = run_demo(seqlen=96, head_dim=16, block=16, heads=2, heads_kv=1, log=lines.append)
    rows = out["rows"]
    assert [r["schedule"] for r in rows] == list(NAMES) * 2
    assert all(r["within_bound"] for r in rows)
    for r in rows:
        if r["schedule"] in ("naive", "interleaved"):  # interleaved: naive's sums, placed
            assert r["acc_diff"] == (0, 0, 0) and r["out_diff"] == (0, 0, 0)
        if r["schedule"] in ("shift", "symmetric_shift"):
            assert r["acc_diff"][0] > 0  # a different dQ order moves fp32 bits
        if r["schedule"] == "descending":
            assert r["acc_diff"][0] == 0 and r["acc_diff"][1] > 0  # same dQ order, new visits
    by_name = {r["schedule"]: r["fingerprint"] for r in rows if r["schedule"] != "atomic"}
    assert by_name["interleaved"] == by_name["naive"]
    others = [f for n, f in by_name.items() if n != "interleaved"]
    assert len(set(others)) == len(others)
    assert out["traces"]["full"]["step"] >= 1
    text = "\n".join(lines)
    assert "<- part here" in text and "fingerprint" in text


def test_demo_command_exits_zero(tmp_path, capsys):
    path = tmp_path / "demo.json"
    assert main(["demo", "--seqlen", "48", "--head-dim", "16", "--block", "16",
                 "--json", str(path)]) == 0
    assert path.exists() and "schedule" in capsys.readouterr().out


def test_the_demo_traces_the_element_section_4_shows():
    """docs/04-the-bits.md says the demo prints its trace: same problem, element, text."""
    import inspect
    from pathlib import Path

    import torch

    from dash_ref import Problem, build_schedule
    from dash_ref.emulate import emulate
    from verify.demo import dq_trace, random_inputs

    defaults = inspect.signature(run_demo).parameters
    seqlen, d, block = (defaults[k].default for k in ("seqlen", "head_dim", "block"))
    heads, heads_kv, workers, seed = (defaults[k].default
                                      for k in ("heads", "heads_kv", "workers", "seed"))
    p = Problem(1, heads, heads_kv, seqlen, seqlen, d, "full", block, block)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed)
    runs = []
    for name in ("naive", "shift"):
        s = build_schedule(p, name, workers)
        runs.append((s, emulate(s, q, k, v, do, return_partials=True, arrival_seed=seed)[1]))
    _, text = dq_trace(*runs, d)
    page = Path(__file__).resolve().parents[1] / "docs" / "figures" / "dq_trace.txt"
    assert text + "\n" == page.read_text()
