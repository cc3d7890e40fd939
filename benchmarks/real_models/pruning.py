"""The pruning on the real models: trials pruned, time saved, and wrong prunes counted.

Each seed runs one study as ``create_study``'s defaults run it (the recipes, the sensitivity
within its share, ``pruning=True``) with optuna-quant's TPE (``sampler="tpe"``) for ``--trials``
trials, in a fresh process. Then, in that process, every trial the pruner stopped is measured
in full with the study's objective, as a trial is. A prune is wrong where that puts the
configuration within the accuracy target and ahead of the study's best model: where its full
``lat_diff`` is within :data:`NEAR` of the best's recorded one, both int8 models are timed
against fp32 in turn for ``--rounds`` rounds and the medians compared (one reading each
decides a near tie by chance); ``ahead_of_bar`` counts those ahead of the best that the pruner
compared with when it pruned (the best within target among the trials finished before it), by
the full measurement. A trial whose evaluation was stopped over the accuracy target
(``eval_samples``: only where the workload scores by samples, ``mnist_demo``) was stopped wrongly
where the full evaluation puts it within the target. The time saved is the full measurement's
timing and evaluation seconds less the pruned trial's; its share is of the study's time had
nothing been pruned (its wall time plus the time saved).

Example:
    python -m benchmarks.real_models.pruning --model ddddocr --seeds 3 --trials 20 \\
        --out benchmarks/results/pruning_ddddocr.json
    python -m benchmarks.real_models.pruning --summary benchmarks/results/pruning_*.json
"""

from __future__ import annotations

import os


# One thread per process, as the runner times.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import asdict  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import onnx  # noqa: E402
import optuna  # noqa: E402
from optuna.trial import FrozenTrial  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.real_models.base import Workload  # noqa: E402
from benchmarks.real_models.baselines import time_against_fp32  # noqa: E402
from benchmarks.real_models.run import ACCURACY_LOSS  # noqa: E402
from benchmarks.real_models.run import in_fresh_process  # noqa: E402
from benchmarks.real_models.run import SETTINGS  # noqa: E402
from benchmarks.real_models.workloads import build  # noqa: E402
from benchmarks.real_models.workloads import LATENCY_TARGETS  # noqa: E402
import optuna_quant  # noqa: E402
from optuna_quant.measure.cpu import int8_support  # noqa: E402
from optuna_quant.trial import records  # noqa: E402
from optuna_quant.trial.results import best_trial  # noqa: E402


def bar_then(trials: Sequence[FrozenTrial], pruned: FrozenTrial, targets: optuna_quant.Targets) -> float | None:
    """The ``lat_diff`` of the best trial within target among those finished before ``pruned`` ended."""
    assert pruned.datetime_complete is not None
    before = [t for t in trials if t.datetime_complete is not None and t.datetime_complete < pruned.datetime_complete]
    best = best_trial(before, targets)
    return None if best is None else records.lat_diff(best)


NEAR = 0.9
"""A pruned model whose full ``lat_diff`` is at least this share of the best's is re-timed beside it."""


def side_by_side(workload: Workload, first: onnx.ModelProto, second: onnx.ModelProto, rounds: int) -> tuple[float, float]:
    """The median ``lat_diff`` of two int8 models over ``rounds`` rounds, each timing both in turn."""
    readings: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for model, kept in zip((first, second), readings):
            kept.append(time_against_fp32(workload, model, SETTINGS).lat_diff)
    return statistics.median(readings[0]), statistics.median(readings[1])


def run_seed(model: str, seed: int, trials: int, rounds: int) -> dict[str, Any]:
    """One default study of ``model`` with ``seed``, then each pruned trial measured in full and judged against the best."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
    workload = build(model)
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        study = optuna_quant.create_study(
            **workload.study_kwargs(),
            accuracy_loss=ACCURACY_LOSS,
            latency_reduce=LATENCY_TARGETS[model],
            sampler="tpe",
            seed=seed,
            storage=optuna.storages.InMemoryStorage(),
            study_name=f"{model}-pruning-{seed}",
            benchmark=asdict(SETTINGS),
            artifact_dir=folder,
        )
        study.optimize(n_trials=trials)
        wall = time.perf_counter() - start
    frozen = study.trials
    targets = study.objective.targets
    best = best_trial(frozen, targets)
    assert best is not None
    pruned = [t for t in frozen if t.state == TrialState.PRUNED and "lat_blocks" in t.user_attrs and "duplicate_of" not in t.user_attrs]
    checks = []
    for trial in pruned:
        full = study.objective.measure(trial.params)
        within = full.quantized and targets.accuracy_met(full.acc_loss)
        then = bar_then(frozen, trial, targets)
        check = {
            "number": trial.number,
            "blocks": trial.user_attrs["lat_blocks"],
            "pruned_lat_diff": records.lat_diff(trial),
            "full_lat_diff": full.lat_diff,
            "full_acc_loss": full.acc_loss,
            "best_lat_diff": records.lat_diff(best),
            "bar_then": then,
            "wrong": False,
            "ahead_of_bar": within and then is not None and full.lat_diff > then,
            "eval_samples": trial.user_attrs.get("eval_samples"),
            "eval_wrong": "eval_samples" in trial.user_attrs and within,
            "seconds_saved": full.latency_seconds + full.eval_seconds - sum(records.seconds_spent(trial)[1:]),
        }
        if within and full.lat_diff >= NEAR * records.lat_diff(best):
            pruned_again, best_again = side_by_side(
                workload, study.objective.build(trial.params), study.objective.build(best.params), rounds
            )
            check.update(side_by_side={"pruned": pruned_again, "best": best_again}, wrong=pruned_again > best_again)
        checks.append(check)
    return {
        "seed": seed,
        "wall_s": wall,
        "trials": len(frozen),
        "pruned": sum(t.state == TrialState.PRUNED for t in frozen),
        "measured": sum("lat_blocks" in t.user_attrs and "duplicate_of" not in t.user_attrs for t in frozen),
        "best": {"number": best.number, "lat_diff": records.lat_diff(best), "acc_loss": records.acc_loss(best)},
        "checks": checks,
    }


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """Over a report's seeds: trials pruned of those measured, wrong prunes and stops, and the time saved."""
    runs = [run for run in report["runs"] if "error" not in run]
    checks = [check for run in runs for check in run["checks"]]
    seconds = [sum(c["seconds_saved"] for c in run["checks"]) for run in runs]
    saved = [spared / (run["wall_s"] + spared) for spared, run in zip(seconds, runs)]  # of the unpruned study's time
    return {
        "model": report["model"],
        "int8_class": report["int8_class"],
        "seeds": len(runs),
        "trials": sum(run["trials"] for run in runs),
        "measured": sum(run["measured"] for run in runs),
        "pruned": len(checks),
        "wrong": sum(c["wrong"] for c in checks),
        "ahead_of_bar": sum(c["ahead_of_bar"] for c in checks),
        "retimed": sum("side_by_side" in c for c in checks),
        "eval_stopped": sum(c.get("eval_samples") is not None for c in checks),
        "eval_wrong": sum(c.get("eval_wrong", False) for c in checks),
        "saved_share": statistics.median(saved) if saved else None,
        "saved_s": statistics.median(seconds) if runs else None,
    }


def wrong_prunes(report: dict[str, Any]) -> list[str]:
    """One line per wrong prune of a report: the seed, the trial and the readings that judged it."""
    return [
        f"{report['model']} seed {run['seed']} trial {c['number']}: pruned at {c['pruned_lat_diff']:.3f}, in full "
        f"{c['full_lat_diff']:.3f}; beside the best over the rounds {c['side_by_side']['pruned']:.3f} against "
        f"{c['side_by_side']['best']:.3f} (the best's recorded reading {c['best_lat_diff']:.3f})"
        for run in report["runs"]
        if "error" not in run
        for c in run["checks"]
        if c["wrong"]
    ]


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """The summaries as one Markdown table."""
    lines = [
        "| model (class) | trials measured | pruned | near ties re-timed | wrong prunes | ahead of the bar then | evaluations stopped (wrongly) | time saved a study, median (share of its time unpruned) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        share = "–" if row["saved_share"] is None else f"{row['saved_s']:.1f} s ({100 * row['saved_share']:.0f} %)"
        lines.append(
            f"| {row['model']} ({row['int8_class']}) | {row['measured']} | {row['pruned']} | {row['retimed']} | {row['wrong']} | "
            f"{row['ahead_of_bar']} | {row['eval_stopped']} ({row['eval_wrong']}) | {share} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="workload name (benchmarks.real_models.workloads.WORKLOADS)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    parser.add_argument("--trials", type=int, default=20, help="trials per study, the reference included")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a near tie is re-timed in, beside the best")
    parser.add_argument("--out", type=Path, help="JSON file the runs are written to")
    parser.add_argument("--summary", type=Path, nargs="+", metavar="JSON", help="print the table of stored reports and exit")
    args = parser.parse_args(argv)
    if args.summary is None and (args.model is None or args.out is None):
        parser.error("give --model and --out, or --summary")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.summary is not None:
        reports = [json.loads(path.read_text()) for path in args.summary]
        print(format_summary([summarise(report) for report in reports]))
        print("\n".join(line for report in reports for line in wrong_prunes(report)))
        return
    report = {
        "model": args.model,
        "int8_class": int8_support().int8_class,
        "accuracy_loss": ACCURACY_LOSS,
        "trials": args.trials,
        "rounds": args.rounds,
        "settings": asdict(SETTINGS),
        "versions": versions(),
        "runs": [],
    }
    for seed in range(args.seeds):
        run = in_fresh_process(run_seed, args.model, seed, args.trials, args.rounds)
        report["runs"].append({"seed": seed, **run})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, sort_keys=True))
        done = summarise(report)
        result = run.get("error") or f"{done['pruned']} pruned of {done['measured']} so far, {done['wrong']} wrong"
        print(f"{args.model} seed {seed}: {result}", flush=True)
    print(format_summary([summarise(report)]))


if __name__ == "__main__":
    main()
