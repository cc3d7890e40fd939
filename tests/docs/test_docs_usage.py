"""What docs/cli.md and docs/dashboard.md tell a user to do from Python, run as written."""

from __future__ import annotations

from pathlib import Path
import re

import optuna
import tomllib


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), flags=re.S)


def test_quieting_optuna_from_python_as_cli_md_shows() -> None:
    (block,) = _python_blocks("cli.md")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)  # other test modules set WARNING at import
    try:
        exec(block, {})
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING
    finally:
        optuna.logging.set_verbosity(verbosity)


def test_dashboard_figures_callback_as_dashboard_md_shows(make_study) -> None:
    (block,) = _python_blocks("dashboard.md")
    study = make_study(accuracy_loss=50.0, study_name="docs")
    scope = {"study": study}
    exec(block, scope)
    assert len(study.trials) == 40
    assert len(scope["figures"].seconds) == 40  # after every trial, the reference's included


def test_the_report_needs_no_matplotlib_and_plotly_is_a_dependency() -> None:
    assert "matplotlib" not in (DOCS / "cli.md").read_text()
    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ ]", requirement)[0] for requirement in project["dependencies"]]
    assert "plotly" in names and "matplotlib" not in names
