"""The figures of a quantization study, as Plotly figures: the dashboard and the report draw these.

- :func:`tradeoff_figure`: ``acc_loss`` against ``lat_diff`` for every measured trial, the region
  where both targets are met shaded, the Pareto front and the best trial (POT's rule) marked;
- :func:`pareto_front_figure`: Optuna's own :func:`optuna.visualization.plot_pareto_front` on
  (``acc_loss``, ``lat_diff``), trials that miss a target marked infeasible, for either objective
  mode;
- :func:`history_figure`: each trial's speed-up and the best so far, which POT's loss (with its
  +40 and +80 penalties) hides in optuna-dashboard's own history plot;
- :func:`sensitivity_figure`: per-layer sensitivity, the accuracy each layer costs in int8 against
  the time it saves.

Each is a pure function of the measured trials and the targets (or of the sensitivity mapping);
:func:`figures_of` makes every figure of them, :func:`study_figures` of what a study stores (read
through :mod:`optuna_quant.trial.records`).

Example:
    >>> study = optuna.load_study(study_name="mnist-cnn-int8", storage="sqlite:///demo.db")  # doctest: +SKIP
    >>> study_figures(study)["acc_loss-lat_diff"].write_html("tradeoff.html")               # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import contextmanager

import optuna
from optuna.trial import FrozenTrial
import plotly.graph_objects as go

from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import recorded
from optuna_quant.trial.stopping import meets_targets


ACC_LOSS_LABEL = "acc_loss (relative accuracy loss against fp32)"
LAT_DIFF_LABEL = "lat_diff (fp32 latency / int8 latency, x)"
_MET, _MISSED, _BEST, _TARGET = "#2ca02c", "#9a9a9a", "#d62728", "rgba(44, 160, 44, 0.12)"
_FP32 = "#1f3b73"
# No template: Plotly's default one adds about 8 kB to every stored figure, and optuna-dashboard
# stores figures in 2 kB study attrs, written after every trial.
# The top margin keeps titles clear of the dashboard's tool bar.
_LAYOUT = dict(template="none", margin=dict(l=70, r=20, t=90, b=60), legend=dict(orientation="h", y=-0.25),
               hovermode="closest")


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


def _round(values: Sequence[float]) -> list[float]:
    # Five significant digits draw the same chart as seventeen, in a third of the stored bytes.
    return [float(f"{v:.5g}") for v in values]


_HOVER = "trial %{customdata}<br>acc_loss %{y:.4f}<br>lat_diff %{x:.3f}x<extra></extra>"


def _scatter(trials: Sequence[FrozenTrial], name: str, **marker: object) -> go.Scatter:
    return go.Scatter(
        x=_round([records.lat_diff(t) for t in trials]),
        y=_round([records.acc_loss(t) for t in trials]),
        customdata=[t.number for t in trials],
        hovertemplate=_HOVER,
        mode="markers",
        name=name,
        marker=marker,
    )


def tradeoff_figure(points: Sequence[FrozenTrial], targets: Targets) -> go.Figure:
    """``acc_loss`` against ``lat_diff``: targets shaded, Pareto front and best trial marked.

    Args:
        points: The measured trials (:func:`optuna_quant.trial.results.recorded`).
        targets: The study's targets (:func:`study_targets`).
    """
    figure = go.Figure(layout=go.Layout(
        title=dict(text="Accuracy loss against speed-up (green area: both targets met)"),
        xaxis=dict(title=dict(text=LAT_DIFF_LABEL)),
        yaxis=dict(title=dict(text=ACC_LOSS_LABEL)),
        **_LAYOUT,
    ))
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
        figure.add_annotation(x=1, y=1, xref="paper", yref="paper", xanchor="right", yanchor="bottom",
                              showarrow=False, text=f"{hidden} trial(s) above acc_loss {top:.3g}: zoom out to see")
    figure.add_shape(
        type="rect", x0=targets.lat_th, x1=x_range[1], y0=y_range[0], y1=targets.acc_th,
        fillcolor=_TARGET, line=dict(color=_MET, dash="dash"), layer="below",
    )
    figure.update_xaxes(range=x_range)
    figure.update_yaxes(range=y_range)
    met: list[FrozenTrial] = []
    missed: list[FrozenTrial] = []
    for t in points:
        (met if meets_targets(t, targets) else missed).append(t)
    figure.add_trace(_scatter(met, "both targets met", color=_MET, size=8))
    figure.add_trace(_scatter(missed, "a target missed", color=_MISSED, size=8))
    front = pareto_front(points)
    figure.add_trace(go.Scatter(
        x=_round([records.lat_diff(t) for t in front]), y=_round([records.acc_loss(t) for t in front]),
        mode="lines", line=dict(shape="vh", color="#1f77b4"), name="Pareto front", hoverinfo="skip",
    ))
    if reference:
        figure.add_trace(_scatter(reference, "reference (every layer int8)", symbol="diamond-open", size=14,
                                  color="black"))
    best = best_trial(points, targets)
    if best is not None:
        figure.add_trace(_scatter([best], f"best (trial {best.number})", symbol="star", size=18, color=_BEST,
                                  line=dict(color="black", width=1)))
    figure.add_annotation(x=targets.lat_th, y=targets.acc_th, xanchor="left", yanchor="bottom", showarrow=False,
                          text=f"targets: lat_diff >= {targets.lat_th:g}, acc_loss <= {targets.acc_th:g}")
    return figure


def pareto_front_figure(points: Sequence[FrozenTrial]) -> go.Figure:
    """Optuna's Pareto-front plot of (``acc_loss``, ``lat_diff``) of the measured trials ``points``.

    The trials are copied into an in-memory two-objective study, as a study in ``loss`` mode has
    one objective; trials that miss a target are drawn as infeasible, from the constraints every
    trial records. The hover text says the trial and its two values, not Optuna's list of every
    parameter, which would make the stored figure grow by kilobytes a trial on a large model.
    """
    with _optuna_logs_off():  # the copy's creation, and "no feasible trials" while none is
        pairs = optuna.create_study(directions=["minimize", "maximize"])
        pairs.add_trials(
            optuna.trial.create_trial(
                values=[records.acc_loss(t), records.lat_diff(t)],
                params=t.params,
                distributions=t.distributions,
                user_attrs=t.user_attrs,
                constraints=t.constraints,
            )
            for t in points
        )
        figure = optuna.visualization.plot_pareto_front(pairs, target_names=[ACC_LOSS_LABEL, LAT_DIFF_LABEL])
    figure.update_layout(title=dict(text="Pareto front of acc_loss and lat_diff (Optuna)"), **_LAYOUT)
    figure.update_traces(text=None, hovertemplate="trial %{marker.color}<br>acc_loss %{x:.4f}<br>lat_diff %{y:.3f}x"
                         "<extra></extra>")
    return figure


@contextmanager
def _optuna_logs_off() -> Iterator[None]:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def history_figure(points: Sequence[FrozenTrial], targets: Targets) -> go.Figure:
    """Each measured trial's ``lat_diff`` by trial number, and the best so far by POT's rule."""
    figure = go.Figure(layout=go.Layout(
        title=dict(text="Speed-up per trial and the best so far"),
        xaxis=dict(title=dict(text="trial number (Optuna's, from 0)")),
        yaxis=dict(title=dict(text=LAT_DIFF_LABEL)),
        **_LAYOUT,
    ))
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
        figure.add_trace(go.Scatter(
            x=[t.number for t in trials], y=_round([records.lat_diff(t) for t in trials]), mode="markers",
            name=name, marker=dict(color=color, size=8), customdata=[t.number for t in trials],
            hovertemplate="trial %{x}<br>lat_diff %{y:.3f}x<extra></extra>",
        ))
    best = running_best(points, targets)
    figure.add_trace(go.Scatter(
        x=[t.number for t in points], y=_round([records.lat_diff(b) for b in best]), mode="lines",
        line=dict(shape="hv", color=_BEST), name="best so far (POT's rule)",
    ))
    figure.add_hline(y=targets.lat_th, line=dict(color=_MET, dash="dash"),
                     annotation_text=f"latency target {targets.lat_th:g}x")
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


def sensitivity_figure(sensitivity: Mapping[str, Mapping[str, float]]) -> go.Figure:
    """Per layer: the accuracy its int8 version costs and the time it saves, most costly on top.

    Args:
        sensitivity: ``{node: {"acc_cost": float, "time_saved_ms": float}}``; ``acc_cost`` is the
            ``acc_loss`` that quantizing that layer alone adds.

    Example:
        >>> figure = sensitivity_figure({"conv1": {"acc_cost": 0.02, "time_saved_ms": 0.1},
        ...                              "fc": {"acc_cost": 0.001, "time_saved_ms": 0.01}})
        >>> list(figure.data[0].y)
        ['fc', 'conv1']
    """
    nodes = sorted(sensitivity, key=lambda node: sensitivity[node]["acc_cost"])
    figure = go.Figure(layout=go.Layout(
        title=dict(text="Per-layer sensitivity: what int8 costs and saves, layer by layer"),
        xaxis=dict(title=dict(text="acc_cost (acc_loss that the layer in int8 adds)"), domain=[0, 0.48]),
        xaxis2=dict(title=dict(text="time saved in int8 (ms per run)"), domain=[0.52, 1]),
        yaxis=dict(automargin=True),
        yaxis2=dict(matches="y", showticklabels=False, anchor="x2"),
        height=max(360, 28 * len(nodes) + 200),
        showlegend=False,  # the axis titles say which bars are which
        **_LAYOUT,
    ))
    figure.add_trace(go.Bar(
        y=nodes, x=[sensitivity[n]["acc_cost"] for n in nodes], orientation="h", name="acc_cost",
        marker=dict(color=_BEST),
    ))
    figure.add_trace(go.Bar(
        y=nodes, x=[sensitivity[n]["time_saved_ms"] for n in nodes], orientation="h", name="time saved (ms)",
        marker=dict(color=_MET), xaxis="x2", yaxis="y2",
    ))
    return figure


def figures_of(
    points: Sequence[FrozenTrial], targets: Targets, sensitivity: Mapping[str, Mapping[str, float]] | None = None
) -> dict[str, go.Figure]:
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


def study_figures(study: optuna.Study) -> dict[str, go.Figure]:
    """:func:`figures_of` the study's measured trials, targets and sensitivity, as it stores them.

    Empty before the first measured trial.
    """
    targets = records.stored_targets(study)
    points = recorded(study.get_trials(deepcopy=False))
    if targets is None or not points:
        return {}
    return figures_of(points, targets, records.stored_sensitivity(study))
