"""What docs/cli.md, docs/dashboard.md and README.md tell a user to do from Python, run as written."""

from __future__ import annotations

import json
from pathlib import Path
import re
import time

import optuna
from optuna_dashboard._custom_plot_data import get_plotly_graph_objects
import pytest
import tomllib

from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.visualization.dashboard import REFRESH_SECONDS


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
    start = time.monotonic()
    exec(block, scope)
    seconds = time.monotonic() - start
    assert len(study.trials) == 40
    # At most every REFRESH_SECONDS while the run lasts, and once when it ends.
    assert 1 <= len(scope["figures"].seconds) <= 1 + seconds / REFRESH_SECONDS
    graphs = get_plotly_graph_objects(study.study._storage.get_study_system_attrs(study.study._study_id))
    history = json.loads(graphs["lat_diff-history"])
    assert sum(len(trace["x"]) for trace in history["data"] if trace["mode"] == "markers") == 40


def test_the_report_needs_no_matplotlib_and_plotly_is_a_dependency() -> None:
    assert "matplotlib" not in (DOCS / "cli.md").read_text()
    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~ ]", requirement)[0] for requirement in project["dependencies"]]
    assert "plotly" in names and "matplotlib" not in names


@pytest.mark.parametrize("sampler_class", [TPESampler, DiscreteGPSampler], ids=["tpe", "gp"])
def test_the_samplers_calls_readme_shows_inline_forbid_the_pair_and_skip_what_is_inactive(sampler_class) -> None:
    calls = re.findall(r"`(set_(?:forbidden|inactive)\(.*?\))`", (DOCS.parent / "README.md").read_text())
    assert [call.split("(")[0] for call in calls] == ["set_forbidden", "set_inactive"]
    sampler = sampler_class(seed=0, n_startup_trials=5)
    for call in calls:
        eval(f"sampler.{call}", {"sampler": sampler})

    def objective(trial: optuna.Trial) -> float:
        params = {
            "approach": trial.suggest_categorical("approach", ["static", "dynamic"]),
            "weight_mode": trial.suggest_categorical("weight_mode", ["symmetric", "asymmetric"]),
            "range_estimator": trial.suggest_categorical("range_estimator", ["minmax", "entropy", "percentile"]),
            "activation_mode": trial.suggest_categorical("activation_mode", ["asymmetric", "symmetric"]),
        }
        return float(params["approach"] == "static") + (params["weight_mode"] == "symmetric")

    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=14)
    static = ("range_estimator", "activation_mode")
    built = [
        (p["approach"], p["weight_mode"], *(p[name] for name in static if p["approach"] == "static"))
        for p in (t.params for t in study.trials)
    ]
    # 12 static models, 2 dynamic ones of which the asymmetric is forbidden: 13 to draw, then
    # repeats. The first trial is drawn one parameter at a time, before the space is known.
    assert len(set(built[:13])) == 13
    assert ("dynamic", "asymmetric") not in built[1:]
