"""The figures of a quantization study, as Plotly figures: the dashboard and the report draw these.

- :func:`tradeoff_figure`: ``acc_loss`` against ``lat_diff`` for every measured trial, the region
  where both targets are met shaded, the Pareto front and the best trial (POT's rule) marked;
- :func:`pareto_front_figure`: the Pareto front of (``acc_loss``, ``lat_diff``), trials that miss
  a target drawn as infeasible, as Optuna's ``plot_pareto_front`` draws it, for either objective
  mode;
- :func:`history_figure`: each trial's speed-up and the best so far, which POT's loss (with its
  +40 and +80 penalties) hides in optuna-dashboard's own history plot;
- :func:`sensitivity_figure`: per-layer sensitivity, the accuracy each layer costs in int8 against
  the time it saves.

Each is a pure function of the measured trials and the targets (or of the sensitivity mapping),
and returns the figure as Plotly's JSON schema (a :data:`Figure`, ``{"data": [...], "layout":
{...}}``), which optuna-dashboard stores and draws as it is: a worker that refreshes the
dashboard's figures imports neither Plotly nor optuna-dashboard. :func:`figures_of` makes every
figure of them, :func:`study_figures` of what a study stores (read through
:mod:`optuna_quant.trial.records`).

Example:
    >>> study = optuna.load_study(study_name="mnist-cnn-int8", storage="sqlite:///demo.db")  # doctest: +SKIP
    >>> import plotly.io                                                                      # doctest: +SKIP
    >>> plotly.io.write_html(study_figures(study)["acc_loss-lat_diff"], "tradeoff.html")      # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import recorded
from optuna_quant.trial.stopping import meets_targets


Figure = dict[str, Any]
"""A figure in Plotly's JSON schema: ``{"data": [trace, ...], "layout": {...}}``."""

ACC_LOSS_LABEL = "acc_loss (relative accuracy loss against fp32)"
LAT_DIFF_LABEL = "lat_diff (fp32 latency / int8 latency, x)"
_MET, _MISSED, _BEST, _TARGET = "#2ca02c", "#9a9a9a", "#d62728", "rgba(44, 160, 44, 0.12)"
_FP32 = "#1f3b73"
# Plotly's "none" template, as Plotly writes it: its default one adds about 8 kB to every stored figure, and optuna-dashboard
# stores figures in 2 kB study attrs, written after every trial.
# The top margin keeps titles clear of the dashboard's tool bar.
_LAYOUT = dict(
    template={"data": {"scatter": [{"type": "scatter"}]}},
    margin=dict(l=70, r=20, t=90, b=60),
    legend=dict(orientation="h", y=-0.25),
    hovermode="closest",
)


def _figure(title: str, x_title: str, y_title: str, **layout: Any) -> Figure:
    return {
        "data": [],
        "layout": {
            "title": {"text": title},
            "xaxis": {"title": {"text": x_title}},
            "yaxis": {"title": {"text": y_title}},
            "shapes": [],
            "annotations": [],
            **_LAYOUT,
            **layout,
        },
    }


def study_targets(study: optuna.Study) -> Targets:
    """The targets stored with the study when :func:`optuna_quant.create_study` made it.

    Raises:
        ValueError: If the study holds none: optuna-quant did not make it.
    """
    targets = records.stored_targets(study)
    if targets is None:
        raise ValueError(f"Study {study.study_name!r} holds no targets: optuna_quant.create_study did not make it.")
    return targets


def pareto_front(points: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that no other trial beats on both ``acc_loss`` (lower) and ``lat_diff`` (higher),
    by ascending ``lat_diff``.

    Example:
        >>> trials = [optuna.trial.create_trial(value=0.0, user_attrs={"acc_loss": a, "lat_diff": l})
        ...           for a, l in [(0.01, 1.2), (0.02, 1.1), (0.03, 2.0), (0.0, 1.0)]]
        >>> [(records.acc_loss(t), records.lat_diff(t)) for t in pareto_front(trials)]
        [(0.0, 1.0), (0.01, 1.2), (0.03, 2.0)]
    """
    front: list[FrozenTrial] = []
    # By speed-up, fastest first (then lower loss): a trial is on the front when it loses less
    # accuracy than every faster one.
    for trial in sorted(points, key=lambda t: (-records.lat_diff(t), records.acc_loss(t))):
        if not front or records.acc_loss(trial) < records.acc_loss(front[-1]):
            front.append(trial)
    return front[::-1]


def _round(values: Sequence[float]) -> list[float | None]:
    # Five significant digits draw the same chart as seventeen, in a third of the stored bytes; a
    # value that is no number is a gap, as Plotly writes NaN.
    return [float(f"{v:.5g}") if math.isfinite(v) else None for v in values]


_HOVER = "trial %{customdata}<br>acc_loss %{y:.4f}<br>lat_diff %{x:.3f}x<extra></extra>"


def _scatter(trials: Sequence[FrozenTrial], name: str, **marker: object) -> dict[str, Any]:
    return {
        "type": "scatter",
        "x": _round([records.lat_diff(t) for t in trials]),
        "y": _round([records.acc_loss(t) for t in trials]),
        "customdata": [t.number for t in trials],
        "hovertemplate": _HOVER,
        "mode": "markers",
        "name": name,
        "marker": marker,
    }


def _annotation(text: str, x: float, y: float, **where: object) -> dict[str, Any]:
    return {"text": text, "x": x, "y": y, "showarrow": False, **where}


def tradeoff_figure(points: Sequence[FrozenTrial], targets: Targets) -> Figure:
    """``acc_loss`` against ``lat_diff``: targets shaded, Pareto front and best trial marked.

    Args:
        points: The measured trials (:func:`optuna_quant.trial.results.recorded`).
        targets: The study's targets (:func:`study_targets`).
    """
    figure = _figure("Accuracy loss against speed-up (green area: both targets met)", LAT_DIFF_LABEL, ACC_LOSS_LABEL)
    layout = figure["layout"]
    lat = [records.lat_diff(t) for t in points] + [targets.lat_th]
    acc = [records.acc_loss(t) for t in points] + [targets.acc_th]
    # A few ruined configurations would squeeze the target region into a line: the chart stops at
    # five times the accuracy target (the reference, if higher), and says what it leaves out.
    reference = [t for t in points if records.is_reference(t)]
    top = max([5 * targets.acc_th] + [records.acc_loss(t) for t in reference])
    hidden = sum(a > top for a in acc)
    acc = [a for a in acc if a <= top]
    x_pad, y_pad = 0.05 * (max(lat) - min(lat) or 1.0), 0.05 * (max(acc) - min(acc) or targets.acc_th or 0.01)
    x_range, y_range = [min(lat) - x_pad, max(lat) + x_pad], [min(acc) - y_pad, max(acc) + y_pad]
    if hidden:
        layout["annotations"].append(_annotation(
            f"{hidden} trial(s) above acc_loss {top:.3g}: zoom out to see", 1, 1,
            xref="paper", yref="paper", xanchor="right", yanchor="bottom",
        ))
    layout["shapes"].append({
        "type": "rect", "x0": targets.lat_th, "x1": x_range[1], "y0": y_range[0], "y1": targets.acc_th,
        "fillcolor": _TARGET, "line": {"color": _MET, "dash": "dash"}, "layer": "below",
    })
    layout["xaxis"]["range"] = x_range
    layout["yaxis"]["range"] = y_range
    met: list[FrozenTrial] = []
    missed: list[FrozenTrial] = []
    for t in points:
        (met if meets_targets(t, targets) else missed).append(t)
    figure["data"].append(_scatter(met, "both targets met", color=_MET, size=8))
    figure["data"].append(_scatter(missed, "a target missed", color=_MISSED, size=8))
    front = pareto_front(points)
    figure["data"].append({
        "type": "scatter", "x": _round([records.lat_diff(t) for t in front]),
        "y": _round([records.acc_loss(t) for t in front]), "mode": "lines",
        "line": {"shape": "vh", "color": "#1f77b4"}, "name": "Pareto front", "hoverinfo": "skip",
    })
    if reference:
        figure["data"].append(_scatter(reference, "reference (every layer int8)", symbol="diamond-open", size=14,
                                       color="black"))
    best = best_trial(points, targets)
    if best is not None:
        figure["data"].append(_scatter([best], f"best (trial {best.number})", symbol="star", size=18, color=_BEST,
                                       line={"color": "black", "width": 1}))
    layout["annotations"].append(_annotation(
        f"targets: lat_diff >= {targets.lat_th:g}, acc_loss <= {targets.acc_th:g}", targets.lat_th, targets.acc_th,
        xanchor="left", yanchor="bottom",
    ))
    return figure


def pareto_front_figure(points: Sequence[FrozenTrial]) -> Figure:
    """The Pareto front of (``acc_loss``, ``lat_diff``) of the measured trials ``points``, drawn as
    Optuna's ``plot_pareto_front`` draws it: the front among the feasible trials, the other
    feasible trials, and the trials that miss a target (their recorded constraints) as infeasible.

    The hover text says the trial and its two values, not every parameter, which would make the
    stored figure grow by kilobytes a trial on a large model.

    Example:
        >>> trials = [optuna.trial.create_trial(value=0.0, user_attrs={"acc_loss": a, "lat_diff": l},
        ...                                     constraints={"acc_loss": c}) for a, l, c in
        ...           [(0.01, 1.2, 0.0), (0.02, 1.1, 0.0), (0.03, 2.0, 1.0)]]
        >>> [(trace["name"], trace["x"]) for trace in pareto_front_figure(trials)["data"]]
        [('Best Trial', [0.01]), ('Trial', [0.02]), ('Infeasible Trial', [0.03])]
    """
    figure = _figure("Pareto front of acc_loss and lat_diff", ACC_LOSS_LABEL, LAT_DIFF_LABEL)
    feasible = [t for t in points if all(c <= 0 for c in t.constraints.values())]
    front = pareto_front(feasible)
    on_front, kept = {id(t) for t in front}, {id(t) for t in feasible}
    others = [t for t in feasible if id(t) not in on_front]
    infeasible = [t for t in points if id(t) not in kept]
    hover = "trial %{customdata}<br>acc_loss %{x:.4f}<br>lat_diff %{y:.3f}x<extra></extra>"
    for trials, name, color in ((front, "Best Trial", _BEST), (others, "Trial", "#1f77b4"),
                                (infeasible, "Infeasible Trial", "#cccccc")):
        figure["data"].append({
            "type": "scatter", "x": _round([records.acc_loss(t) for t in trials]),
            "y": _round([records.lat_diff(t) for t in trials]), "customdata": [t.number for t in trials],
            "mode": "markers", "name": name, "marker": {"color": color, "size": 8}, "hovertemplate": hover,
        })
    return figure


def history_figure(points: Sequence[FrozenTrial], targets: Targets) -> Figure:
    """Each measured trial's ``lat_diff`` by trial number, and the best so far by POT's rule."""
    figure = _figure("Speed-up per trial and the best so far", "trial number (Optuna's, from 0)", LAT_DIFF_LABEL)
    within: list[FrozenTrial] = []
    outside: list[FrozenTrial] = []
    fp32: list[FrozenTrial] = []
    for t in points:
        if not records.quantized(t):
            fp32.append(t)
        else:
            (within if targets.accuracy_met(records.acc_loss(t)) else outside).append(t)
    for trials, name, color in ((within, "within the accuracy target", _MET),
                                (outside, "accuracy target missed", _MISSED),
                                (fp32, "the fp32 model (quantizes nothing)", _FP32)):
        figure["data"].append({
            "type": "scatter", "x": [t.number for t in trials], "y": _round([records.lat_diff(t) for t in trials]),
            "mode": "markers", "name": name, "marker": {"color": color, "size": 8},
            "customdata": [t.number for t in trials],
            "hovertemplate": "trial %{x}<br>lat_diff %{y:.3f}x<extra></extra>",
        })
    best = running_best(points, targets)
    figure["data"].append({
        "type": "scatter", "x": [t.number for t in points], "y": _round([records.lat_diff(b) for b in best]),
        "mode": "lines", "line": {"shape": "hv", "color": _BEST}, "name": "best so far (POT's rule)",
    })
    # A line across the plot at the target, as Plotly's add_hline draws one.
    figure["layout"]["shapes"].append({
        "type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": targets.lat_th, "y1": targets.lat_th,
        "line": {"color": _MET, "dash": "dash"},
    })
    figure["layout"]["annotations"].append(_annotation(
        f"latency target {targets.lat_th:g}x", 1, targets.lat_th, xref="x domain", yref="y", xanchor="right",
        yanchor="bottom",
    ))
    return figure


def running_best(points: Sequence[FrozenTrial], targets: Targets) -> list[FrozenTrial]:
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


def sensitivity_figure(sensitivity: Mapping[str, Mapping[str, float]]) -> Figure:
    """Per layer: the accuracy its int8 version costs and the time it saves, most costly on top.

    Args:
        sensitivity: ``{node: {"acc_cost": float, "time_saved_ms": float}}``; ``acc_cost`` is the
            ``acc_loss`` that quantizing that layer alone adds.

    Example:
        >>> figure = sensitivity_figure({"conv1": {"acc_cost": 0.02, "time_saved_ms": 0.1},
        ...                              "fc": {"acc_cost": 0.001, "time_saved_ms": 0.01}})
        >>> figure["data"][0]["y"]
        ['fc', 'conv1']
    """
    nodes = sorted(sensitivity, key=lambda node: sensitivity[node]["acc_cost"])
    figure = _figure(
        "Per-layer sensitivity: what int8 costs and saves, layer by layer",
        "acc_cost (acc_loss that the layer in int8 adds)",
        "",
        xaxis2={"title": {"text": "time saved in int8 (ms per run)"}, "domain": [0.52, 1]},
        yaxis2={"matches": "y", "showticklabels": False, "anchor": "x2"},
        height=max(360, 28 * len(nodes) + 200),
        showlegend=False,  # the axis titles say which bars are which
    )
    figure["layout"]["xaxis"]["domain"] = [0, 0.48]
    figure["layout"]["yaxis"] = {"automargin": True}
    figure["data"] += [
        {"type": "bar", "y": nodes, "x": [sensitivity[n]["acc_cost"] for n in nodes], "orientation": "h",
         "name": "acc_cost", "marker": {"color": _BEST}},
        {"type": "bar", "y": nodes, "x": [sensitivity[n]["time_saved_ms"] for n in nodes], "orientation": "h",
         "name": "time saved (ms)", "marker": {"color": _MET}, "xaxis": "x2", "yaxis": "y2"},
    ]
    return figure


def figures_of(
    points: Sequence[FrozenTrial], targets: Targets, sensitivity: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, Figure]:
    """Every figure of the measured trials ``points`` by a stable id (an HTML id): the tradeoff,
    the Pareto front, the history and, given a ``sensitivity``, the per-layer sensitivity."""
    figures = {
        "acc_loss-lat_diff": tradeoff_figure(points, targets),
        "pareto-front": pareto_front_figure(points),
        "lat_diff-history": history_figure(points, targets),
    }
    if sensitivity:
        figures["layer-sensitivity"] = sensitivity_figure(sensitivity)
    return figures


def study_figures(study: optuna.Study) -> dict[str, Figure]:
    """:func:`figures_of` the study's measured trials, targets and sensitivity, as it stores them.

    Empty before the first measured trial.
    """
    targets = records.stored_targets(study)
    points = recorded(study.get_trials(deepcopy=False))
    if targets is None or not points:
        return {}
    return figures_of(points, targets, records.stored_sensitivity(study))
