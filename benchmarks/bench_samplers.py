"""Sampler benchmark: replay studies against quantization tables.

A real trial quantizes and measures a model and costs seconds; a table (``benchmarks/tables/``)
holds every configuration of a real space measured once, so that many studies with many seeds can
be replayed in minutes. The objective looks the configuration up and returns POT's weighted loss
(``optuna_quant.measure.loss``), scaled by the table's default configuration. A sampler is judged by how
few trials it needs to reach the targets.

Samplers: Optuna's ``random``, ``optuna-tpe`` and ``optuna-gp`` (5.0 defaults, seeded),
``hyperopt-tpe`` with POT's settings run through hyperopt's own ``fmin`` loop, optuna-quant's
``oq-gp`` and ``oq-tpe`` when importable, and any ``--sampler module:callable`` (a callable that
takes ``seed`` and returns a sampler).

Example:
    .venv/bin/python -m benchmarks.bench_samplers --seeds 20 --budget 100 --jobs 1

Runs of different samplers (or seed counts) combine into one report, one table and one PNG per
table with ``--from-results a.json b.json``.

``--prior`` hands optuna-quant's samplers (``set_prior``) per-choice scores (:data:`PRIORS`); they
report as ``<name>+prior``, or ``<name>+prior-<kind>`` for ``--prior <kind>``: ``sensitivity``
(the default) is ``optuna_quant.prior_for_space`` of the table's measured sensitivity
(:func:`sensitivity_prior`), ``standin`` the earlier stand-in read from the table's rows
(:func:`standin_prior`), ``inverted`` the first with every score mirrored, a wrong prior
(:func:`inverted_prior`), ``single`` the first without the pairs of layers, one layer at a time.

``--stop-at-target`` ends each study at its first trial that meets both targets. Trials-to-target,
success, duplicates and sampler time keep their meaning (counted up to that trial), and Optuna's
GPSampler, whose trials cost seconds late in a study, becomes affordable over many seeds; the best
``lat_diff`` and the loss curves need whole studies, so they are left out of such a run.

Metrics per sampler and table, over the seeds:

- trials-to-target: 1-based index of the first trial that meets both targets, ``budget + 1`` if
  none does (median and IQR), and the success rate within the budget;
- best ``lat_diff`` within the accuracy target after 25, 50, 100 trials and the budget (median; a study with
  no such trial counts as the worst, so a median of ``None`` means most studies had none);
- duplicates: trials whose configuration was suggested before while unevaluated ones remained
  (each is a spent trial, as in POT, which returned the stored result);
- sampler time per trial: study time minus objective time, per trial.
"""

from __future__ import annotations

import os


# One thread per process: the machine is shared, and --jobs is the only parallelism wanted.
# Set before numpy and torch load, which read these once.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from dataclasses import field  # noqa: E402
import functools  # noqa: E402
from functools import lru_cache  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from optuna.distributions import CategoricalDistribution  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.table import Key  # noqa: E402
from benchmarks.table import Table  # noqa: E402
from benchmarks.table import table_paths  # noqa: E402
from optuna_quant.measure.interactions import PairRecovery  # noqa: E402
from optuna_quant.measure.sensitivity import LayerSensitivity  # noqa: E402
from optuna_quant.trial.guidance import Guidance  # noqa: E402
from optuna_quant.trial.guidance import prior_for_space  # noqa: E402
from optuna_quant.trial.guidance import queued_params  # noqa: E402
from optuna_quant.trial.scoring import layer_scores  # noqa: E402
from optuna_quant.trial.space import LAYER_PREFIX  # noqa: E402


RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHECKPOINTS = (25, 50, 100)
HYPEROPT_TPE = "hyperopt-tpe"
BASELINES = {
    "random": "optuna.samplers:RandomSampler",
    "optuna-tpe": "optuna.samplers:TPESampler",
    "optuna-gp": "optuna.samplers:GPSampler",
    HYPEROPT_TPE: HYPEROPT_TPE,
}
PEERS = {
    "oq-gp": "optuna_quant.samplers:DiscreteGPSampler",
    "oq-tpe": "optuna_quant.samplers:TPESampler",
}
# POT's hyperopt settings (DESIGN.md section 8); n_EI_candidates and prior_weight depend on the space.
POT_N_STARTUP_JOBS = 10
POT_GAMMA = 0.3


@dataclass
class Trace:
    """What one study did, trial by trial."""

    keys: list[Key] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    sampler_seconds: float = 0.0


class Replay:
    """The table-backed objective shared by every runner: looks up, records, times itself.

    Args:
        table: The table to replay.
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.trace = Trace()
        self._objective_seconds = 0.0

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Count the enclosed time as objective time, not sampler time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._objective_seconds += time.perf_counter() - start

    @property
    def target_met(self) -> bool:
        """Whether the last recorded trial meets both targets."""
        return bool(self.trace.keys) and self.table.met(self.table.row_at(self.trace.keys[-1]))

    def evaluate(self, params: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """Look a configuration up and record it; returns its row and POT's loss."""
        row = self.table.lookup(params)
        loss = self.table.loss(params)
        self.trace.keys.append(self.table.key(params))
        self.trace.loss.append(loss)
        return row, loss

    def finish(self, study_seconds: float) -> Trace:
        """The trace, with the sampler's share of ``study_seconds``."""
        self.trace.sampler_seconds = study_seconds - self._objective_seconds
        return self.trace


SamplerFactory = Callable[[int], optuna.samplers.BaseSampler]


def resolve(spec: str) -> SamplerFactory:
    """The sampler factory named by ``module:callable``; it is called as ``factory(seed=seed)``.

    Raises:
        ImportError: If the module cannot be imported.
        AttributeError: If the module has no such callable.
    """
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"A sampler spec is module:callable, got {spec!r}.")
    factory = functools.reduce(getattr, attr.split("."), importlib.import_module(module_name))
    return lambda seed: factory(seed=seed)


def standin_prior(table: Table) -> dict[str, dict[str, float]]:
    """``optuna_quant.trial.scoring.layer_scores`` of each layer from the table's own rows.

    The row of the default configuration with that layer alone in fp32 gives both what
    reverting it buys in accuracy (in accuracy targets) and what it costs in speed (the share of
    the default's ``lat_diff`` it loses): the stand-in used before the tables carried the
    measured sensitivity, kept to compare the measurement with.

    Raises:
        ValueError: If the table has no stand-in measurements.
    """
    if table.layer_sensitivity_standin is None:
        raise ValueError(
            f"Table {table.name!r} has no per-layer measurements (layer_sensitivity_standin); add them "
            "with: .venv/bin/python -m benchmarks.build_tables --layer-standin"
        )
    reference = table.lookup(table.reference)
    target = table.target.accuracy_loss / 100.0
    return {
        name: layer_scores(
            (reference["acc_loss"] - row["acc_loss"]) / target,
            (reference["lat_diff"] - row["lat_diff"]) / reference["lat_diff"],
        )
        for name, row in table.layer_sensitivity_standin.items()
    }


def table_guidance(table: Table, with_pairs: bool = True) -> Guidance:
    """What a study of the table's space measures before its prior and start-up trials.

    The table's ``scope_errors`` and ``base_sensitivity`` (with its ``pairs``, where measured)
    are what a study measures (``build_tables.with_sensitivity``), named by the table's
    parameters; the reference's ``acc_loss`` is the table's default row, as a study's reference
    trial gives it. Nothing else comes from the rows.

    ``with_pairs=False`` leaves the pairs out: the guidance as it was before pairs were
    measured, one layer at a time.

    Raises:
        ValueError: If the table has no ``scope_errors`` or ``base_sensitivity``.
    """
    if table.scope_errors is None or table.base_sensitivity is None:
        raise ValueError(
            f"Table {table.name!r} has no scope_errors or base_sensitivity; add them with: "
            f".venv/bin/python -m benchmarks.build_tables --sensitivity-only --tables {table.name}"
        )
    layers = {
        name.removeprefix(LAYER_PREFIX): LayerSensitivity.from_dict(measured)
        for name, measured in table.base_sensitivity["layers"].items()
    }
    pairs = tuple(PairRecovery.from_dict(pair) for pair in table.base_sensitivity.get("pairs", ()) if with_pairs)
    return Guidance(layers, table.scope_errors, table.lookup(table.reference)["acc_loss"], pairs=pairs)


def table_distributions(table: Table) -> dict[str, CategoricalDistribution]:
    """The table's space as Optuna distributions."""
    return {name: CategoricalDistribution(choices) for name, choices in table.params.items()}


def sensitivity_prior(table: Table, with_pairs: bool = True) -> dict[str, dict[str, Any]]:
    """``optuna_quant.prior_for_space`` of :func:`table_guidance`, for the table's space.

    Raises:
        ValueError: If the table has no ``scope_errors`` or ``base_sensitivity``.
    """
    return prior_for_space(table_guidance(table, with_pairs), table_distributions(table), table.target)


def inverted_prior(table: Table) -> dict[str, dict[str, Any]]:
    """:func:`sensitivity_prior` with every score mirrored (``1 - score``): a prior that points
    away from what the measurement says, to see what a wrong prior costs."""
    return {
        name: {choice: round(1.0 - score, 4) for choice, score in by_choice.items()}
        for name, by_choice in sensitivity_prior(table).items()
    }


PRIORS: dict[str, Callable[[Table], dict[str, dict[str, Any]]]] = {
    "sensitivity": sensitivity_prior,
    "standin": standin_prior,
    "inverted": inverted_prior,
    "single": functools.partial(sensitivity_prior, with_pairs=False),
}
"""The priors ``--prior`` can give, by name; the first is the default."""
PRIOR_SUFFIX = {kind: "+prior" if kind == "sensitivity" else f"+prior-{kind}" for kind in PRIORS}


def run_optuna(
    factory: SamplerFactory,
    table: Table,
    seed: int,
    budget: int,
    constraints: bool,
    stop_at_target: bool = False,
    prior: str | None = None,
    live_queue: bool = False,
) -> Trace:
    """One Optuna study of ``budget`` trials on the table (fewer when it stops at the target);
    with ``prior`` (a key of :data:`PRIORS`), the sampler gets that prior through its ``set_prior``.

    With ``live_queue`` the study starts as an optuna-quant study does: the reference first, then
    (with the ``sensitivity`` prior) the start-up trials that such a study queues for the sampler
    (``optuna_quant.trial.guidance.queued_params``), and the prior is given again after each trial as
    the study gives it, with the base configuration's loss once measured (``Guidance.measured_at_base``)."""
    replay = Replay(table)

    def objective(trial: optuna.Trial) -> float:
        params = {name: trial.suggest_categorical(name, table.params[name]) for name in table.names}
        with replay.timing():
            row, loss = replay.evaluate(params)
            trial.set_user_attr("acc_loss", row["acc_loss"])
            trial.set_user_attr("lat_diff", row["lat_diff"])
            if constraints:
                for name, value in table.constraints(row).items():
                    trial.set_constraint(name, value)
        if stop_at_target and replay.target_met:
            trial.study.stop()
        return loss

    sampler = factory(seed)
    if prior is not None:
        sampler.set_prior(PRIORS[prior](table))
    start = time.perf_counter()
    study = optuna.create_study(sampler=sampler)
    callbacks = []
    if live_queue:
        study.enqueue_trial(table.reference)
        if prior == "sensitivity":
            guidance, distributions = table_guidance(table), table_distributions(table)
            for params in queued_params(guidance, sampler, budget, distributions, table.target):
                study.enqueue_trial(params, skip_if_exists=True)
            # As a study's worker does before each trial (optuna_quant.trial.guidance.set_prior).
            def measured_prior(study: optuna.Study, _: optuna.trial.FrozenTrial) -> None:
                at_base = guidance.measured_at_base(distributions, table.target, study.get_trials(deepcopy=False))
                sampler.set_prior(prior_for_space(at_base, distributions, table.target))

            callbacks.append(measured_prior)
    study.optimize(objective, n_trials=budget, callbacks=callbacks)
    return replay.finish(time.perf_counter() - start)


def smallest_choice_count(table: Table) -> int:
    """POT's M: the fewest choices of any parameter that has more than one."""
    return min(len(choices) for choices in table.params.values() if len(choices) > 1)


def run_hyperopt(table: Table, seed: int, budget: int, stop_at_target: bool = False) -> Trace:
    """One hyperopt ``fmin`` run with POT's TPE settings on the table."""
    import hyperopt

    replay = Replay(table)
    m = smallest_choice_count(table)
    algo = hyperopt.partial(
        hyperopt.tpe.suggest,
        n_startup_jobs=POT_N_STARTUP_JOBS,
        gamma=POT_GAMMA,
        n_EI_candidates=m,
        prior_weight=1.0 / m,
    )
    space = {name: hyperopt.hp.choice(name, table.params[name]) for name in table.names}

    def objective(params: dict[str, Any]) -> float:
        with replay.timing():
            return replay.evaluate(params)[1]

    start = time.perf_counter()
    hyperopt.fmin(
        objective,
        space,
        algo=algo,
        max_evals=budget,
        trials=hyperopt.Trials(),
        rstate=np.random.default_rng(seed),
        show_progressbar=False,
        early_stop_fn=(lambda trials, *state: (replay.target_met, state)) if stop_at_target else None,
    )
    return replay.finish(time.perf_counter() - start)


@dataclass(frozen=True)
class Task:
    """One study to replay; picklable, so that it can run in a worker process."""

    sampler: str
    spec: str
    table_path: str
    seed: int
    budget: int
    constraints: bool
    stop_at_target: bool = False
    prior: str | None = None
    live_queue: bool = False


@lru_cache(maxsize=None)
def load_table(path: str) -> Table:
    """A table, read once per process."""
    return Table.load(path)


def run_task(task: Task) -> Trace:
    """Replay one study."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    table = load_table(task.table_path)
    if task.spec == HYPEROPT_TPE:
        return run_hyperopt(table, task.seed, task.budget, task.stop_at_target)
    return run_optuna(
        resolve(task.spec),
        table,
        task.seed,
        task.budget,
        task.constraints,
        task.stop_at_target,
        task.prior,
        task.live_queue,
    )


# ---- metrics -------------------------------------------------------------------------------


def trials_to_target(trace: Trace, table: Table, budget: int) -> int:
    """1-based index of the first trial meeting both targets; ``budget + 1`` if none does."""
    for index, key in enumerate(trace.keys, start=1):
        if table.met(table.row_at(key)):
            return index
    return budget + 1


def count_duplicates(keys: Sequence[Key], space_size: int) -> int:
    """Trials whose configuration was suggested before while unevaluated ones remained."""
    seen: set[Key] = set()
    duplicates = 0
    for key in keys:
        if key in seen and len(seen) < space_size:
            duplicates += 1
        seen.add(key)
    return duplicates


def best_feasible_lat_diff(trace: Trace, table: Table, n_trials: int) -> float | None:
    """The best ``lat_diff`` of an int8 model within the accuracy target among the first ``n_trials`` trials."""
    within = [row["lat_diff"] for row in map(table.row_at, trace.keys[:n_trials]) if table.usable(row)]
    return max(within, default=None)


def checkpoints(budget: int) -> list[int]:
    """The trial counts at which the best ``lat_diff`` is reported: 25, 50, 100 and the budget."""
    return sorted({n for n in CHECKPOINTS if n < budget} | {budget})


def median_missing_worst(values: Sequence[float | None]) -> float | None:
    """The median, a missing value counting as the worst; ``None`` when the median is missing."""
    median = float(np.median([-np.inf if v is None else v for v in values]))
    return median if np.isfinite(median) else None


def quartiles(values: Sequence[float] | np.ndarray, axis: int | None = None) -> np.ndarray:
    """25th, 50th and 75th percentiles."""
    return np.percentile(np.asarray(values, dtype=float), [25, 50, 75], axis=axis)


def summarise(traces: Sequence[Trace], table: Table, budget: int, stopped: bool = False) -> dict[str, Any]:
    """The metrics of one sampler on one table over its seeds.

    ``stopped``: the studies ended at their target, so that the whole-study metrics (best
    ``lat_diff`` at the checkpoints, the loss curve) are ``None``.
    """
    hits = [trials_to_target(trace, table, budget) for trace in traces]
    q25, median, q75 = quartiles(hits)
    duplicates = [count_duplicates(trace.keys, table.size) for trace in traces]
    sampler_ms = [1000.0 * trace.sampler_seconds / len(trace.keys) for trace in traces]
    summary: dict[str, Any] = {
        "seeds": len(traces),
        "trials_to_target": {"median": median, "q25": q25, "q75": q75, "per_seed": hits},
        "success_rate": float(np.mean([hit <= budget for hit in hits])),
        "best_lat_diff": None,
        "duplicates": {"median": float(np.median(duplicates)), "per_seed": duplicates},
        "sampler_ms_per_trial": float(np.median(sampler_ms)),
        "best_loss_curve": None,
    }
    if not stopped:
        curves = quartiles([np.minimum.accumulate(trace.loss) for trace in traces], axis=0)
        summary["best_lat_diff"] = {
            str(n): median_missing_worst([best_feasible_lat_diff(t, table, n) for t in traces])
            for n in checkpoints(budget)
        }
        summary["best_loss_curve"] = {k: c.tolist() for k, c in zip(("q25", "median", "q75"), curves)}
    return summary


# ---- reporting -----------------------------------------------------------------------------


def format_table(table: Table, results: dict[str, dict[str, Any]], budget: int) -> str:
    """A Markdown table of the metrics, one row per sampler, under a line that sums up the table."""
    counts = [str(n) for n in checkpoints(budget)]
    header = ["sampler", "seeds", "trials to target, median (IQR)", "success"]
    header += [f"best lat_diff @{n}" for n in counts] + ["duplicates", "sampler ms/trial"]
    lines = [
        f"{table.name}: {table.size} configurations, {table.feasible_fraction:.2%} meet both targets, "
        f"best lat_diff {table.best_lat_diff:.3f}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, r in results.items():
        ttt = r["trials_to_target"]
        lats = [None if r["best_lat_diff"] is None else r["best_lat_diff"][n] for n in counts]
        cells = [
            name,
            str(r["seeds"]),
            f"{ttt['median']:.1f} ({ttt['q25']:.1f}-{ttt['q75']:.1f})",
            f"{r['success_rate']:.0%}",
            *("-" if lat is None else f"{lat:.3f}" for lat in lats),
            f"{r['duplicates']['median']:.1f}",
            f"{r['sampler_ms_per_trial']:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_table(table: Table, results: dict[str, dict[str, Any]], path: Path) -> None:
    """Median best-so-far loss against trials, one line per sampler with its IQR shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: r for name, r in results.items() if r["best_loss_curve"] is not None}
    if not curves:
        return  # every run stopped at its target: no curves to draw
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, r in curves.items():
        curve = r["best_loss_curve"]
        x = np.arange(1, len(curve["median"]) + 1)
        (line,) = ax.plot(x, curve["median"], label=f"{name} ({r['seeds']} seeds)")
        ax.fill_between(x, curve["q25"], curve["q75"], color=line.get_color(), alpha=0.15)
    ax.axhline(table.min_loss, color="black", linestyle=":", label="optimum")
    ax.set_xlabel("trial")
    ax.set_ylabel("best loss so far (POT's weighted loss)")
    ax.set_title(
        f"{table.name}: {table.size} configs, {table.feasible_fraction:.1%} meet targets; median and IQR over seeds",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- command line --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The runner's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="studies per sampler and table")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (use unseen seeds to check tuning)")
    parser.add_argument("--budget", type=int, default=100, help="trials per study")
    parser.add_argument("--tables", nargs="+", help="table names (file stems); default: all")
    parser.add_argument(
        "--samplers", nargs="+", help=f"subset of {sorted(BASELINES) + sorted(PEERS)}; default: all"
    )
    parser.add_argument(
        "--sampler", action="append", default=[], metavar="MODULE:CALLABLE", help="an extra sampler factory"
    )
    parser.add_argument(
        "--constraints",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="report both targets as trial constraints to Optuna samplers",
    )
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="end each study at its first trial that meets both targets (no best lat_diff or curves)",
    )
    parser.add_argument(
        "--prior",
        nargs="?",
        const="sensitivity",
        choices=sorted(PRIORS),
        help="give the samplers (those with set_prior) a prior from each table's measurements: "
        "'sensitivity' (the default: optuna_quant.prior_for_space; names get '+prior'), "
        "'standin' (from the table's rows; names get '+prior-standin'), "
        "'inverted' (the first, every score mirrored: a wrong prior; '+prior-inverted'), "
        "'single' (the first without the pairs of layers; '+prior-single')",
    )
    parser.add_argument(
        "--live-queue",
        action="store_true",
        help="start each study as optuna-quant's does: the reference first, then (with --prior sensitivity) "
        "the start-up trials it queues for the sampler; trials to target count them",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "samplers.json", help="JSON results file")
    parser.add_argument("--plots-dir", type=Path, default=RESULTS_DIR, help="where the PNGs go")
    parser.add_argument(
        "--from-results", nargs="+", type=Path, metavar="JSON", help="run nothing: merge these results files"
    )
    return parser.parse_args(argv)


def choose_samplers(names: Sequence[str] | None, extra: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The samplers to run, ``{name: spec}``, and the skipped ones with the reason."""
    candidates = {**BASELINES, **PEERS}
    unknown = sorted(set(names or ()) - set(candidates))
    if unknown:
        raise SystemExit(f"Unknown samplers {unknown}; known: {sorted(candidates)} (or --sampler module:callable).")
    candidates = {name: candidates[name] for name in (names or candidates)}
    candidates.update({spec: spec for spec in extra})
    chosen, skipped = {}, {}
    for name, spec in candidates.items():
        try:
            if spec != HYPEROPT_TPE:
                resolve(spec)
            chosen[name] = spec
        except (ImportError, AttributeError) as error:
            skipped[name] = f"not importable: {spec}: {error}"
    return chosen, skipped


def run_tasks(tasks: list[Task], jobs: int) -> list[Trace]:
    """Replay every study, in ``jobs`` processes."""
    if jobs <= 1:
        return [run_task(task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_task, tasks, chunksize=1))


def run_report(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """Replay the studies that ``args`` ask for and summarise them."""
    samplers, skipped = choose_samplers(args.samplers, args.sampler)
    if args.prior:
        without = sorted(
            name
            for name, spec in samplers.items()
            if spec == HYPEROPT_TPE or not hasattr(resolve(spec)(0), "set_prior")
        )
        if without:
            raise SystemExit(f"--prior needs samplers with set_prior; these have none: {without}.")
        samplers = {name + PRIOR_SUFFIX[args.prior]: spec for name, spec in samplers.items()}
    if args.live_queue and HYPEROPT_TPE in samplers.values():
        raise SystemExit(f"--live-queue queues trials in Optuna studies; {HYPEROPT_TPE} runs hyperopt's own loop.")
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}", file=sys.stderr)
    paths = table_paths(args.tables)
    for path in paths if args.prior else ():
        PRIORS[args.prior](load_table(str(path)))  # a table without the measurement fails before any study
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    tasks = [
        Task(
            name, spec, str(path), seed, args.budget, args.constraints, args.stop_at_target, args.prior, args.live_queue
        )
        for path in paths
        for name, spec in samplers.items()
        for seed in seeds
    ]
    traces = iter(run_tasks(tasks, args.jobs))
    report: dict[str, Any] = {
        "commands": [
            ".venv/bin/python -m benchmarks.bench_samplers " + " ".join(sys.argv[1:] if argv is None else argv)
        ],
        "versions": [versions()],
        "budget": args.budget,
        "seeds": list(seeds),
        "constraints": args.constraints,
        "stop_at_target": args.stop_at_target,
        "live_queue": args.live_queue,
        "skipped": skipped,
        "tables": {},
    }
    for path in paths:
        table = load_table(str(path))
        report["tables"][table.name] = {
            "size": table.size,
            "feasible_fraction": table.feasible_fraction,
            "best_lat_diff": table.best_lat_diff,
            "samplers": {
                name: summarise([next(traces) for _ in seeds], table, args.budget, args.stop_at_target)
                for name in samplers
            },
        }
    return report


MERGED_SETTINGS = {"budget": None, "constraints": True, "stop_at_target": False, "live_queue": False}
"""The settings that merged reports must share, with what a report from before one existed ran."""


def merge_reports(paths: Sequence[Path]) -> dict[str, Any]:
    """One report from the JSON results of several runs with the same settings (later runs win)."""
    reports = [json.loads(path.read_text()) for path in paths]
    settings = {tuple(report.get(key, default) for key, default in MERGED_SETTINGS.items()) for report in reports}
    if len(settings) != 1:
        raise SystemExit(
            f"Cannot merge runs with different ({', '.join(MERGED_SETTINGS)}): {sorted(settings)}."
        )
    merged: dict[str, Any] = {
        "commands": [],
        "versions": [],
        **dict(zip(MERGED_SETTINGS, settings.pop())),
        "skipped": {},
        "tables": {},
    }
    for report in reports:
        merged["commands"] += report["commands"]
        # Runs from before versions were recorded have none.
        merged["versions"] += report.get("versions", [None] * len(report["commands"]))
        merged["skipped"].update(report["skipped"])
        for name, entry in report["tables"].items():
            merged["tables"].setdefault(name, {**entry, "samplers": {}})["samplers"].update(entry["samplers"])
    return merged


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark (or merge runs), print a table per table, write the JSON and the PNGs."""
    args = parse_args(argv)
    report = merge_reports(args.from_results) if args.from_results else run_report(args, argv)
    args.plots_dir.mkdir(parents=True, exist_ok=True)
    for name, entry in report["tables"].items():
        table = load_table(str(table_paths([name])[0]))
        print(format_table(table, entry["samplers"], report["budget"]), end="\n\n")
        plot_table(table, entry["samplers"], args.plots_dir / f"samplers_{table.name}.png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
