"""README's examples print what README says they print: the Python API block (its output block beside it) and the
usage tour's lines that show an output, run with the default model as a user runs them."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _user_env() -> dict[str, str]:
    """The test session's environment as a user has it: no $KLEIDIPY_MODEL (the default model loads)."""
    return {k: v for k, v in os.environ.items() if k != "KLEIDIPY_MODEL"}


def _block_after(marker: str, lang: str) -> str:
    """The first ```lang block after ``marker`` in README."""
    found = re.search(rf"```{lang}\n(.*?)```", README[README.index(marker) :], re.S)
    assert found, f"no ```{lang} block after {marker!r}"
    return found.group(1)


def test_python_api_block_prints_what_readme_shows() -> None:
    code = _block_after("**Python API.**", "python")
    shown = _block_after("**Python API.**", "text")
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_user_env(), timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == shown


@pytest.mark.parametrize(
    "args",
    [("run", "-m", "gemma3-270m", "-p", "Water boils at a temperature of", "--temp", "0", "-n", "7")],
)
def test_usage_tour_line_prints_what_its_comment_says(args: tuple[str, ...]) -> None:
    line = next(line for line in README.splitlines() if line.startswith("kleidipy " + " ".join(args[:3])))
    said = re.search(r'# .*"(.+)"', line)
    assert said, line
    command = [sys.executable, "-m", "kleidipy", *shlex.split(line.split("#")[0])[1:], "-q"]
    assert command[3:-1] == list(args)
    proc = subprocess.run(command, capture_output=True, text=True, env=_user_env(), timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == said.group(1)
