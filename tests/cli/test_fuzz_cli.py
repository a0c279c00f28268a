"""CLI argument ranges: every numeric option of every command with every kind of bad (and some good) value, run
in-process on a tiny model. Each run must succeed, or end with exactly one ``kleidipy: error:`` line, no traceback
and a non-zero exit status. ``serve`` does not start serving (uvicorn.Server.run is replaced)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import uvicorn
from fuzzing import Tally, outcome
from gguf import GGMLQuantizationType as T
from tiny_models import write_model

from kleidipy.cli import main

VALUES = ["-1", "0", "1", "-5", "3", "2147483648", "10000000", "1e9", "0.5", "nan", "inf", "-inf", "abc", "", "1,2"]
#: command -> its options that take a number (with their usual small, fast value for the other runs)
OPTIONS = {
    "run": ["-c", "-t", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed"],
    "chat": ["-c", "-t", "-n", "--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed"],
    "trace": ["-c", "-t", "-n"],
    "serve": ["-c", "-t", "--port", "--parallel"],
    "bench": ["-t", "-p", "-n"],
    "layout": ["--svl", "--shape"],
    "emulate": ["--svl", "--shape", "--seed"],
}
#: values that are valid but would run for a long time, not what this fuzzer is about
SLOW = {("bench", "-p", "10000000"), ("bench", "-n", "10000000")}


def command_line(command: str, option: str, value: str, model: Path) -> list[str]:
    model_args = ["-m", str(model), "-q"] if command in ("run", "chat", "serve", "bench") else []
    if command == "trace":
        model_args = ["-m", str(model)]
    fixed = {
        "run": ["-p", "hi", "-n", "2"],
        "chat": ["-n", "2"],
        "trace": ["-n", "1"],
        "bench": ["-p", "4", "-n", "2", "-r", "1"],
        "emulate": ["--shape", "16,64,64"],
    }.get(command, [])
    return [command, *model_args, *fixed, option, value]


def cli_outcome(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    """``"ok"``, ``"error (one line)"``, or a failure (see fuzzing.outcome): an exception out of main, a hang, or
    an exit that is not one error line with a non-zero status (reported as an AssertionError)."""
    result = []

    def case() -> None:
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("kleidipy: error:")]
        if status != 0 and (len(lines) != 1 or "Traceback" in err):
            raise AssertionError(f"exit {status}: {err[-300:]}")
        result.append("ok" if status == 0 else "error (one line)")

    first = outcome(case)
    return result[0] if first == "ok" else first


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cli_argument_ranges(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    model = write_model(tmp_path / "tiny.gguf", "qwen2", T.Q4_0)
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: setattr(server, "started", True))
    # the multi-thread entry points compiled once, untimed: in a fresh virtualenv their first compile can take longer
    # than a case's time limit, whose alarm then interrupts numba mid-compile (a later case met "no compiled object")
    assert main(command_line("bench", "-t", "2", model)) == 0
    capsys.readouterr()
    tally = Tally()
    for command, options in OPTIONS.items():
        for option in options:
            for value in VALUES:
                if (command, option, value) in SLOW:
                    continue
                monkeypatch.setattr("sys.stdin", io.StringIO(""))  # chat: end of input at once
                argv = command_line(command, option, value, model)
                tally.add(cli_outcome(capsys, argv), " ".join(argv))
    assert not tally.failures, tally.report("CLI fuzz")
    assert tally.counts["ok"] and tally.counts["error (one line)"]
