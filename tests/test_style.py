"""One style for the whole tree, as ``pyproject.toml``'s ``[tool.ruff]`` sets it: the lint rules and
the formatter pass on the engine, the tests, the exercises and their solutions."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["minillm", "tests", "exercises", "solutions"]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    run = subprocess.run([sys.executable, "-m", "ruff", *command, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, (
        f"ruff {' '.join(command)} (fix with `ruff check --fix` / `ruff format`):\n{run.stdout}{run.stderr}"
    )
