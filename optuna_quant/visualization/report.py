"""A static, self-contained HTML report of a study, from the figures optuna-dashboard shows.

The report holds the figures of :mod:`optuna_quant.visualization.figures` (``acc_loss`` against ``lat_diff``
with the targets shaded and the best trial marked, the Pareto front, the speed-up per trial, the
per-layer sensitivity when the study holds one) as interactive Plotly figures, plotly.js inlined
once so that the page opens offline, and the best configuration as a table. It reads only the
storage: no model or data is needed.

Example:
    >>> study = optuna.load_study(study_name="mnist-cnn-int8", storage="sqlite:///demo.db")  # doctest: +SKIP
    >>> write_report(study, "report.html")                                                    # doctest: +SKIP
"""

from __future__ import annotations

import html
from pathlib import Path

import optuna
from optuna.trial import TrialState
import plotly.io

from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import BestResult
from optuna_quant.trial.results import recorded
from optuna_quant.trial.timing import time_report
from optuna_quant.visualization.figures import figures_of
from optuna_quant.visualization.figures import study_targets


_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }
th { background: #f0f0f0; }
"""


def render_report(study: optuna.Study) -> str:
    """The report of ``study`` as one HTML page.

    Raises:
        ValueError: If the study has no completed trial, or optuna-quant did not make it.
    """
    targets = study_targets(study)
    trials = study.get_trials(deepcopy=False)
    best = best_trial(trials, targets)
    if best is None:
        raise ValueError(f"Study {study.study_name!r} has no completed trial to report.")
    result = BestResult.from_trial(best, targets)
    name = html.escape(study.study_name)
    finished = [state for state in TrialState if state.is_finished()]
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in finished}
    fp32_accuracy = records.stored_fp32_accuracy(study)
    overview = {
        "trials": ", ".join(f"{n} {state}" for state, n in counts.items() if n),
        "fp32 accuracy": "not recorded" if fp32_accuracy is None else fp32_accuracy,
        "accuracy target": f"acc_loss <= {targets.acc_th:.4f} (accuracy_loss {targets.accuracy_loss} %)",
        "latency target": f"lat_diff >= {targets.lat_th:.4f} (latency_reduce)",
        "best": result.summary(),
        "time": time_report(trials, best, records.sensitivity_seconds(study)).summary(),
    }
    measured = {"acc_loss": result.acc_loss, "lat_diff": result.lat_diff}
    accuracy = records.int8_accuracy(best)
    if accuracy is not None:
        measured["accuracy"] = accuracy
    figures = figures_of(recorded(trials), targets, records.stored_sensitivity(study))
    # plotly.js is inlined with the first figure only: one copy serves them all.
    html_figures = [
        plotly.io.to_html(figure, full_html=False, include_plotlyjs=i == 0, div_id=figure_id)
        for i, (figure_id, figure) in enumerate(figures.items())
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8"><title>optuna-quant: {name}</title>',
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>optuna-quant study {name}</h1>",
            _table(overview),
            *html_figures,
            f"<h2>Best configuration (trial {result.number})</h2>",
            _table({**measured, "loss": result.loss}),
            _table(dict(sorted(result.params.items())), header=("parameter", "value")),
            "</body></html>",
        ]
    )


def write_report(study: optuna.Study, path: str | Path) -> Path:
    """Write :func:`render_report` of ``study`` to ``path`` and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(study), encoding="utf-8")
    return path


def _table(rows: dict[str, object], header: tuple[str, str] | None = None) -> str:
    cells = [f"<tr><th>{html.escape(header[0])}</th><th>{html.escape(header[1])}</th></tr>"] if header else []
    for key, value in rows.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        cells.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(shown)}</td></tr>")
    return "<table>" + "".join(cells) + "</table>"
