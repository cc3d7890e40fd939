"""A static, self-contained HTML report of a finished study (figures embedded as base64 PNGs).

The report shows the optimisation history (each trial's loss and the best so far by POT's rule),
``acc_loss`` against ``lat_diff`` with both targets drawn and the best trial marked, and the best
configuration as a table. It reads only the storage: no model or data is needed.

Example:
    >>> study = optuna.load_study(study_name="mnist-cnn-int8", storage="sqlite:///demo.db")  # doctest: +SKIP
    >>> write_report(study, "report.html")                                                    # doctest: +SKIP
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.loss import Targets
from optuna_quant.objective import FP32_ACCURACY_KEY
from optuna_quant.objective import TARGETS_KEY
from optuna_quant.results import best_trial
from optuna_quant.results import BestResult
from optuna_quant.results import recorded
from optuna_quant.results import trial_loss

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.8em; text-align: left; }
th { background: #f0f0f0; }
img { max-width: 100%; }
"""


def study_targets(study: optuna.Study) -> Targets:
    """The targets that the study recorded when its first trial ran.

    Raises:
        ValueError: If the study recorded none (no trial ever ran).
    """
    if TARGETS_KEY not in study.user_attrs:
        raise ValueError(f"Study {study.study_name!r} has no recorded trial yet.")
    return Targets(**study.user_attrs[TARGETS_KEY])


def render_report(study: optuna.Study) -> str:
    """The report of ``study`` as one HTML page.

    Raises:
        ValueError: If the study has no completed trial.
        ImportError: If matplotlib is not installed.
    """
    targets = study_targets(study)
    trials = study.get_trials(deepcopy=False)
    points = recorded(trials)  # the trials with a measurement, which every figure plots
    best = best_trial(points, targets)
    if best is None:
        raise ValueError(f"Study {study.study_name!r} has no completed trial to report.")
    result = BestResult.from_trial(best, targets)
    name = html.escape(study.study_name)
    finished = [state for state in TrialState if state.is_finished()]
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in finished}
    overview = {
        "trials": ", ".join(f"{n} {state}" for state, n in counts.items() if n),
        "fp32 accuracy": study.user_attrs.get(FP32_ACCURACY_KEY, "not recorded"),
        "accuracy target": f"acc_loss <= {targets.acc_th:.4f} (accuracy_loss {targets.accuracy_loss} %)",
        "latency target": f"lat_diff >= {targets.lat_th:.4f} (latency_reduce)",
        "best": result.summary(),
    }
    measured = {key: best.user_attrs[key] for key in ("acc_loss", "lat_diff", "accuracy")
                if key in best.user_attrs}
    return "\n".join(
        [
            "<!DOCTYPE html>",
            f'<html lang="en"><head><meta charset="utf-8"><title>optuna-quant: {name}</title>',
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>optuna-quant study {name}</h1>",
            _table(overview),
            "<h2>Optimisation history</h2>",
            _image(_history_figure(points, targets), "loss per trial and best so far"),
            "<h2>Accuracy loss against speed-up</h2>",
            _image(_tradeoff_figure(points, targets, best), "acc_loss against lat_diff with the targets"),
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


def _image(figure: Figure, alt: str) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _new_figure() -> Figure:
    # The Figure class needs no pyplot and no display backend, so reports render on servers too.
    from matplotlib.figure import Figure

    return Figure(figsize=(8, 4.5))


def _history_figure(points: list[FrozenTrial], targets: Targets) -> Figure:
    figure = _new_figure()
    axes = figure.subplots()
    numbers = [t.number for t in points]
    axes.scatter(numbers, [trial_loss(t) for t in points], s=18, color="tab:blue", label="trial loss")
    axes.step(
        numbers,
        [trial_loss(b) for b in _running_best(points, targets)],
        where="post",
        color="tab:red",
        label="best so far (POT's rule)",
    )
    axes.set_xlabel("trial")
    axes.set_ylabel("loss (POT's weighted loss)")
    axes.grid(alpha=0.3)
    axes.legend()
    return figure


def _running_best(points: Sequence[FrozenTrial], targets: Targets) -> list[FrozenTrial]:
    """The best of ``points[: i + 1]`` by POT's rule for each ``i``, in one pass over ``points``.

    POT's rule keeps the earlier of two equal trials, so the best of a prefix is the better of
    the previous prefix's best and the prefix's last trial.
    """
    best: list[FrozenTrial] = []
    for trial in points:
        better = best_trial([*best[-1:], trial], targets)
        assert better is not None  # points are recorded trials, so one of them is the better
        best.append(better)
    return best


def _tradeoff_figure(points: list[FrozenTrial], targets: Targets, best: FrozenTrial) -> Figure:
    figure = _new_figure()
    axes = figure.subplots()
    met = [targets.met(t.user_attrs["acc_loss"], t.user_attrs["lat_diff"]) for t in points]
    groups = ((True, "tab:green", "both targets met"), (False, "tab:gray", "a target missed"))
    for wanted, color, label in groups:
        chosen = [t for t, m in zip(points, met) if m == wanted]
        if chosen:
            axes.scatter(
                [t.user_attrs["lat_diff"] for t in chosen],
                [t.user_attrs["acc_loss"] for t in chosen],
                s=18,
                color=color,
                label=label,
            )
    axes.axhline(targets.acc_th, color="tab:orange", ls="--", label=f"accuracy target {targets.acc_th:.4f}")
    axes.axvline(targets.lat_th, color="tab:purple", ls="--", label=f"latency target {targets.lat_th:.2f}")
    axes.scatter(
        [best.user_attrs["lat_diff"]],
        [best.user_attrs["acc_loss"]],
        marker="*",
        s=250,
        color="tab:red",
        edgecolors="black",
        zorder=3,
        label=f"best (trial {best.number})",
    )
    axes.set_xlabel("lat_diff (fp32 latency / int8 latency)")
    axes.set_ylabel("acc_loss (relative)")
    axes.grid(alpha=0.3)
    axes.legend()
    return figure
