"""Imports one way, Optuna's: ruff's isort rules of ``pyproject.toml`` hold on every Python file."""

from __future__ import annotations

from pathlib import Path
import subprocess
import sys


ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("optuna_quant", "tests", "benchmarks", "examples", "docs")


def test_every_file_sorts_its_imports_as_pyproject_says() -> None:
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--select", "I", "--no-cache", *FOLDERS], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
