"""Lint, format and types, configured in pyproject.toml, checked with the suite (and so by CI)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.prerequisites import REPO, need

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff check", "ruff format", "mypy"],
)
def test_the_code_is_clean(command: list[str]) -> None:
    tool = BIN / command[0]
    need(tool.exists(), f"{command[0]} is not installed (pip install -e '.[test]')")
    result = subprocess.run([str(tool), *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
