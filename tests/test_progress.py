"""Long runs say how far they are on stderr, also when stderr is not a terminal."""

from __future__ import annotations

from verify.progress import Progress


def test_a_line_per_interval_on_stderr_even_when_piped(capsys):
    bar = Progress(4, "audit emulator:naive", unit="trials", interval=0.0)
    for _ in range(4):
        bar.update()
    out, err = capsys.readouterr()  # capsys: stderr is not a terminal here
    lines = err.splitlines()
    assert out == "" and len(lines) == 4
    assert lines[1].startswith("audit emulator:naive: 2/4 trials, ") and "s left" in lines[1]


def test_quiet_within_the_first_interval_and_when_disabled(capsys):
    for bar in (Progress(3, "fuzz x", interval=60.0), Progress(3, "fuzz x", enabled=False,
                                                                interval=0.0)):
        for _ in range(3):
            bar.update()
    assert capsys.readouterr().err == ""
