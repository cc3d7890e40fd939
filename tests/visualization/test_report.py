"""The HTML report of a real study: self-contained, with both figures and the best configuration."""

from __future__ import annotations

import re

import numpy as np
import optuna
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.trial.records import SENSITIVITY_KEY
from optuna_quant.trial.results import best_trial
from optuna_quant.visualization.figures import history_figure
from optuna_quant.visualization.figures import running_best
from optuna_quant.visualization.report import render_report
from optuna_quant.visualization.report import write_report


@pytest.mark.parametrize("objective_mode", ["loss", "pareto"])
def test_report_embeds_figures_and_best_config(tmp_path, make_study, objective_mode) -> None:
    study = make_study(
        accuracy_loss=50.0, latency_reduce=1.2, study_name="report", objective_mode=objective_mode, sensitivity="full"
    )
    best = study.optimize(n_trials=3)
    path = write_report(study.study, tmp_path / "out" / "report.html")
    text = path.read_text()
    # Plotly figures, plotly.js inlined once: nothing to fetch, it opens offline.
    assert text.count("Plotly.newPlot(") == 4 and text.count("* plotly.js v") == 1
    markup = re.sub(r"<script[^>]*>.*?</script>", "<script></script>", text, flags=re.S)
    assert "<script></script>" in markup and not re.search(r'(src|href)="https?:', markup)
    for figure_id in ("acc_loss-lat_diff", "pareto-front", "lat_diff-history", "layer-sensitivity"):
        assert f'id="{figure_id}"' in text
    assert "Accuracy loss against speed-up (green area: both targets met)" in text
    assert f"Best configuration (trial {best.number})" in text
    for name, value in best.params.items():
        assert f"<td>{name}</td><td>{value}</td>" in text
    assert best.summary() in text
    assert f"<td>time</td><td>{study.time_report().summary()}</td>" in text  # where the time went
    assert "acc_loss &lt;= 0.5000" in text and "lat_diff &gt;= 1.2000" in text


def test_report_of_a_study_without_trials(tmp_path) -> None:
    study = optuna.create_study(study_name="empty", storage=f"sqlite:///{tmp_path}/empty.db")
    with pytest.raises(ValueError, match="Study 'empty' holds no targets: optuna_quant.create_study did not make it"):
        render_report(study)


def test_running_best_is_the_best_of_every_prefix() -> None:
    rng = np.random.default_rng(0)
    # Few distinct values, so that ties (kept by the earlier trial) occur; the accuracy target is
    # first missed by every trial, then met by some.
    acc_losses = np.concatenate([rng.choice([0.02, 0.05], 10), rng.choice([0.0, 0.005, 0.02], 50)])
    trials = [
        optuna.trial.create_trial(
            value=float(rng.choice([1.0, 2.0, 3.0])),
            user_attrs={"acc_loss": float(acc_loss), "lat_diff": float(rng.choice([1.1, 1.5, 2.0]))},
        )
        for acc_loss in acc_losses
    ]
    for number, trial in enumerate(trials):
        trial.number = number
    targets = Targets(accuracy_loss=1.0)
    expected = [best_trial(trials[: i + 1], targets) for i in range(len(trials))]
    assert [t.number for t in running_best(trials, targets)] == [t.number for t in expected]


def test_the_history_shows_the_fp32_model_apart_from_the_int8_models_within_accuracy() -> None:
    def trial(number: int, acc_loss: float, lat_diff: float, quantized: bool) -> optuna.trial.FrozenTrial:
        made = optuna.trial.create_trial(
            value=0.0, user_attrs={"acc_loss": acc_loss, "lat_diff": lat_diff, "quantized": quantized}
        )
        made.number = number
        return made

    # The fp32 model reads no accuracy loss and a lat_diff at the target: no int8 result to draw as met.
    points = [trial(0, 0.02, 1.5, True), trial(1, 0.0, 1.0, False), trial(2, 0.005, 1.2, True)]
    figure = history_figure(points, Targets(accuracy_loss=1.0, latency_reduce=1.0))
    drawn = {trace["name"]: trace["x"] for trace in figure["data"] if trace["mode"] == "markers"}
    assert drawn == {
        "within the accuracy target": [2],
        "accuracy target missed": [0],
        "the fp32 model (quantizes nothing)": [1],
    }


def test_report_shows_the_sensitivity_the_study_holds(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0, study_name="sensitive")
    study.optimize(n_trials=2)
    # Written here for now: the study will store the sensitivity itself (optuna_quant.measure.sensitivity).
    study.study.set_user_attr(SENSITIVITY_KEY, {"conv2": {"acc_cost": 0.04, "time_saved_ms": 0.01}})
    text = render_report(study.study)
    assert text.count("Plotly.newPlot(") == 4 and 'id="layer-sensitivity"' in text and '"conv2"' in text
