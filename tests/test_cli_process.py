"""``dash-verify`` as a process: Ctrl-C, a closed pipe, and the JSON envelope of any error.

These run the command in a subprocess (about three seconds each, mostly importing torch),
because signals and pipes are what they are about.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from verify.cli import EXIT_CLOSED_PIPE, EXIT_INTERRUPTED, main

CLI = [sys.executable, "-m", "verify.cli"]


def test_ctrl_c_prints_one_line_and_exits_130():
    # minutes of trials (under the CLI's size budget); the signal is sent once the first
    # progress line (after 5 s of trials) shows the run is inside them (a fixed sleep could
    # land in the imports on a loaded host). The child gets SIGINT's default action: a
    # suite started as a background job (`cmd &`) has SIGINT ignored, and a child
    # inherits that
    run = subprocess.Popen([*CLI, "audit", "--impl", "emulator:naive", "--seqlen-q", "512",
                            "--trials", "2000", "--json"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    progress = run.stderr.readline()
    assert progress.startswith("audit emulator:naive: ") and "/2000 trials, " in progress
    run.send_signal(signal.SIGINT)
    out, err = run.communicate(timeout=60)
    assert run.returncode == EXIT_INTERRUPTED == 130
    *more_progress, last = err.splitlines(keepends=True) or [""]
    assert last == "dash-verify audit: interrupted\n"
    assert all(line.startswith("audit emulator:naive: ") for line in more_progress)
    assert json.loads(out)["exit_code"] == 130


def test_a_closed_pipe_ends_quietly_with_141():
    # about 220 kB of output, well past what a pipe buffers
    run = subprocess.Popen([*CLI, "schedule", "--name", "shift", "--seqlen-q", "4096",
                            "--block-m", "32", "--block-n", "32", "--heads", "32"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = run.stdout.readline()
    run.stdout.close()  # what `| head -1` does
    err = run.stderr.read()
    run.wait(timeout=60)
    assert first.startswith("schedule 'shift'")
    assert run.returncode == EXIT_CLOSED_PIPE == 141
    assert err == ""


def test_an_argument_error_still_writes_the_envelope(tmp_path, capsys):
    target = tmp_path / "out.json"
    assert main(["schedule", "--seqlen-q", "0", "--json", str(target)]) == 2
    err = capsys.readouterr().err
    document = json.loads(target.read_text())
    assert document["exit_code"] == 2 and document["command"] == "schedule"
    assert "--seqlen-q" in document["error"] and err.count("\n") == 1
    # and on stdout, where it is the only thing written
    assert main(["simulate", "--model", "fast", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["exit_code"] == 2 and "--model" in err


def test_an_unwritable_json_path_is_one_line_and_exit_2(tmp_path, capsys):
    for path in ("/nonexistent/out.json", str(tmp_path)):  # no folder; a folder, not a file
        assert main(["schedule", "--seqlen-q", "64", "--json", path]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
