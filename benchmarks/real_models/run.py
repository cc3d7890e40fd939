"""Live studies and baselines on the real models, stored per seed; ``--summary`` prints the tables.

Each study and each baseline runs in a fresh process, so that its peak memory (``ru_maxrss``) is
its own. A study is ``optuna_quant.create_study`` on the workload as a user would call it (the model
file as shipped, or the torch module with example inputs), run for ``--trials`` trials without
stopping at the target, so that the best ``lat_diff`` within the accuracy target can be read after
10, 20 and 40 trials. Methods:

- ``tpe``, ``gp``: optuna-quant's samplers; ``tpe+prior``, ``gp+prior``: the same with the
  per-layer sensitivity the study measures after its reference (``create_study(sensitivity=True)``:
  the samplers' prior and start-up trials); ``optuna_tpe``: Optuna's TPESampler; every study
  runs the recipes after its reference (``recipes=True``) but ``tpe+full`` and ``gp+full``: the
  studies as ``create_study`` ran them before the recipes, the whole sensitivity measured after
  the reference (``sensitivity="full", recipes=False``); every study prunes the trials that
  cannot win (``pruning=True``) but ``tpe+prior+unpruned``; ``gp+prior`` is the defaults, and
  ``gp+prior+no_recovery`` the defaults without the recovery transforms' scopes
  (:data:`optuna_quant.quantization.recovery.TRANSFORMS`);
- ``ort_default``, ``ort_preprocessed``, ``ort_dynamic``..., ``nncf``: the recipes that need no
  tuning, and the peers ``inc`` and ``olive``, run with their own environment's python
  (:mod:`benchmarks.real_models.baselines`); each runs once, as seed 0.

Results are merged into ``--out`` (a run of the same method and seed replaces the stored one), so
that methods and seeds can be run apart and the tables recomputed from the file.

Example:
    python -m benchmarks.real_models.run --model silero_vad --seeds 5 --trials 40 \\
        --out benchmarks/results/real_silero_vad.json
    python -m benchmarks.real_models.run --summary benchmarks/results/real_silero_vad.json
    python -m benchmarks.real_models.run --out benchmarks/results/real_silero_vad.json \\
        --merge /elsewhere/real_silero_vad.json
"""

from __future__ import annotations

import os


# One thread per process: latency is timed on one thread, and the machine is shared.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import asdict  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import multiprocessing  # noqa: E402
from pathlib import Path  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import optuna  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.real_models.baselines import BASELINES  # noqa: E402
from benchmarks.real_models.baselines import measure  # noqa: E402
from benchmarks.real_models.baselines import PEERS  # noqa: E402
from benchmarks.real_models.workloads import build  # noqa: E402
from benchmarks.real_models.workloads import LATENCY_TARGETS  # noqa: E402
import optuna_quant  # noqa: E402
from optuna_quant.measure.latency import BenchmarkSettings  # noqa: E402
from optuna_quant.quantization.recovery import TRANSFORMS  # noqa: E402
from optuna_quant.trial.space import LAYER_PREFIX  # noqa: E402
from optuna_quant.trial.space import SCOPES  # noqa: E402


SETTINGS = BenchmarkSettings(threads=1, warmup=5, blocks=8, min_seconds=1.0)
ACCURACY_LOSS = 1.0  # percent
CHECKPOINTS = (10, 20, 40)
BAR_TRIALS = 20
BAR_FRACTION = 0.95
SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "tpe": lambda seed: optuna_quant.TPESampler(seed=seed),
    "gp": lambda seed: optuna_quant.DiscreteGPSampler(seed=seed),
    "optuna_tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),
}
PRIOR_SUFFIX = "+prior"
FULL_SUFFIX = "+full"
UNPRUNED_SUFFIX = "+unpruned"
NO_RECOVERY_SUFFIX = "+no_recovery"
TUNING = (
    "tpe", "gp", "tpe+prior", "gp+prior", "optuna_tpe", "tpe+full", "gp+full", "tpe+prior+unpruned", "gp+prior+no_recovery"
)
METHODS = (*TUNING, *BASELINES)
DEFAULT_METHODS = tuple(method for method in METHODS if method not in PEERS)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_study(model: str, method: str, seed: int, trials: int, latency_reduce: float, sizes: dict[str, int]) -> dict[str, Any]:
    """One study of ``method`` (a name of :data:`TUNING`) with ``seed``: what each trial measured."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Configured logging keeps optuna-quant from adding its per-trial lines: the parent prints one a study.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
    workload = build(model, **sizes)
    record: dict[str, Any] = {"workload_rss_mb": _peak_rss_mb()}
    # +no_recovery: the defaults without the recovery transforms' scopes.
    recovery = not method.endswith(NO_RECOVERY_SUFFIX)
    base = method.removesuffix(NO_RECOVERY_SUFFIX).removesuffix(UNPRUNED_SUFFIX)
    sampler = SAMPLERS[base.removesuffix(PRIOR_SUFFIX).removesuffix(FULL_SUFFIX)](seed)
    with tempfile.TemporaryDirectory() as folder:
        opened, start = time.time(), time.perf_counter()
        study = optuna_quant.create_study(
            **workload.study_kwargs(),
            accuracy_loss=ACCURACY_LOSS,
            latency_reduce=latency_reduce,
            sampler=sampler,
            storage=optuna.storages.InMemoryStorage(),
            study_name=f"{model}-{method}-{seed}",
            trials_load_method="cold_start",
            stop_on_target=False,
            benchmark=asdict(SETTINGS),
            artifact_dir=folder,
            # +prior: the defaults (the recipes, then the sensitivity within its share of the time);
            # +full: the defaults before the time-to-quality change (the whole sensitivity, no recipe).
            sensitivity="full" if base.endswith(FULL_SUFFIX) else base.endswith(PRIOR_SUFFIX),
            recipes=not base.endswith(FULL_SUFFIX),
            pruning=not method.endswith(UNPRUNED_SUFFIX),
            scopes=SCOPES if recovery else tuple(scope for scope in SCOPES if scope not in TRANSFORMS),
        )
        record["setup_s"] = time.perf_counter() - start
        study.optimize(n_trials=trials)
        guidance = study.user_attrs.get("guidance")
        record["prior_s"] = None if guidance is None else guidance["seconds"]
        record["sensitivity_plan"] = study.user_attrs.get("sensitivity_plan")  # what the budget chose
        record["wall_s"] = time.perf_counter() - start
    record["trials"] = [
        {
            "number": t.number,
            "state": t.state.name,
            "acc_loss": t.user_attrs.get("acc_loss"),
            "lat_diff": t.user_attrs.get("lat_diff"),
            "spread": t.user_attrs.get("lat_diff_spread"),
            "quantized": t.user_attrs.get("quantized"),
            "elapsed_s": t.datetime_complete.timestamp() - opened if t.datetime_complete else None,
            "params": t.params,
        }
        for t in study.trials
    ]
    quantizer = study.objective.measurer.quantizer
    record["calibration_s"] = dict(quantizer.calibration_seconds)
    record["transform_s"] = dict(quantizer.transform_seconds)
    record["layers"] = sum(name.startswith("layer") for name in study.trials[0].params)
    record["workload"] = {"source": workload.source, "score": workload.score, **workload.info}
    return record


def run_baseline(model: str, method: str, sizes: dict[str, int], save_to: Path | None = None) -> dict[str, Any]:
    """One baseline (a name of :data:`BASELINES`): its int8 model measured as a trial is, and
    written to ``save_to/<model>-<method>.onnx`` if given (to re-time it beside others:
    :mod:`benchmarks.real_models.side_by_side`)."""
    workload = build(model, **sizes)
    record: dict[str, Any] = {"workload_rss_mb": _peak_rss_mb()}
    start = time.perf_counter()
    int8, notes = BASELINES[method](workload)
    record["quantize_s"] = time.perf_counter() - start
    if save_to is not None:
        save_to.mkdir(parents=True, exist_ok=True)
        onnx.save(int8, str(save_to / f"{model}-{method}.onnx"))
    # A peer may run from an environment of its own (make peers): its run keeps its versions when merged.
    record.update(measure(workload, int8, SETTINGS), notes=notes, versions=versions())
    record["wall_s"] = time.perf_counter() - start
    record["workload"] = {"source": workload.source, "score": workload.score, **workload.info}
    return record


def _child(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    try:
        record = fn(*args)
    except Exception as err:  # a failed run is a result to report, not the end of the benchmark
        record = {"error": f"{type(err).__name__}: {err}"[:1000]}
    record["peak_rss_mb"] = _peak_rss_mb()
    return record


def in_fresh_process(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)`` in a new process, with that process's peak memory added as ``peak_rss_mb``."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_child, fn, *args).result()


def load_report(path: Path, header: dict[str, Any]) -> dict[str, Any]:
    """The report stored at ``path``, or a new one; refuses a file made with other settings.

    Raises:
        ValueError: If the stored report's model or settings differ from ``header``'s.
    """
    if not path.exists():
        return {**header, "runs": []}
    report = json.loads(path.read_text())
    # Runs of two CPU int8 classes do not compare (optuna_quant.measure.cpu); a report from before
    # the class was recorded takes none of a known class.
    for key in ("model", "settings", "accuracy_loss", "latency_reduce", "trials", "int8_class"):
        if report.get(key) != header.get(key):
            raise ValueError(f"{path} holds runs with {key} {report.get(key)!r}, not {header.get(key)!r}: use another --out.")
    return report


def store(path: Path, report: dict[str, Any], run: dict[str, Any]) -> None:
    """Put ``run`` into ``report`` (replacing the same method and seed) and write the file."""
    report["runs"] = [r for r in report["runs"] if (r["method"], r["seed"]) != (run["method"], run["seed"])]
    report["runs"].append(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True))


def merge(into: Path, sources: Sequence[Path]) -> dict[str, Any]:
    """Merge the runs of ``sources`` into the report at ``into``: a later run of a method and seed
    replaces an earlier one. For runs made apart (processes or worktrees that cannot share a file).

    Raises:
        ValueError: If a source was made with other settings than ``into``.
    """
    report = json.loads(into.read_text())
    for source in sources:
        for run in load_report(source, report)["runs"]:
            store(into, report, run)
    return report


def quantized(trial: dict[str, Any]) -> bool:
    """Whether a trial's model runs anything in int8 (``optuna_quant.measure.loss.Targets.met``).

    Recorded by the study since it records it; in older reports read from the layer parameters:
    every workload's layer scope holds every quantizable node, so all of them in fp32 is the fp32
    model.

    Example:
        >>> quantized({"params": {"layer:a": "fp32", "layer:b": "fp32"}}), quantized({"params": {"layer:a": "int8"}})
        (False, True)
    """
    if trial.get("quantized") is not None:
        return bool(trial["quantized"])
    layers = [value for name, value in trial.get("params", {}).items() if name.startswith(LAYER_PREFIX)]
    return not layers or "int8" in layers


def within_target(trials: Sequence[dict[str, Any]], acc_th: float) -> list[dict[str, Any]]:
    """The completed trials of an int8 model whose ``acc_loss`` meets ``acc_th``."""
    return [
        t for t in trials
        if t["state"] == "COMPLETE" and t["acc_loss"] is not None and t["acc_loss"] <= acc_th and quantized(t)
    ]


def best_within(trials: Sequence[dict[str, Any]], acc_th: float, n_trials: int) -> float | None:
    """The highest ``lat_diff`` among the first ``n_trials`` trials that meet ``acc_th``.

    Example:
        >>> trials = [{"number": 0, "state": "COMPLETE", "acc_loss": 0.5, "lat_diff": 3.0},
        ...           {"number": 1, "state": "COMPLETE", "acc_loss": 0.0, "lat_diff": 1.2},
        ...           {"number": 2, "state": "COMPLETE", "acc_loss": 0.001, "lat_diff": 1.5}]
        >>> best_within(trials, 0.01, 2), best_within(trials, 0.01, 3)
        (1.2, 1.5)
    """
    hits = [t["lat_diff"] for t in within_target(trials, acc_th) if t["number"] < n_trials]
    return max(hits) if hits else None


def first_hit(trials: Sequence[dict[str, Any]], acc_th: float, lat_th: float) -> dict[str, Any] | None:
    """The first trial that meets both targets."""
    return next((t for t in within_target(trials, acc_th) if t["lat_diff"] >= lat_th), None)


def checkpoints(budget: int) -> list[int]:
    """The trial counts at which the best ``lat_diff`` is reported: 10, 20, 40 below the budget, and the budget.

    Example:
        >>> checkpoints(40), checkpoints(5)
        ([10, 20, 40], [5])
    """
    return sorted({n for n in CHECKPOINTS if n < budget} | {budget})


def _stats(values: Sequence[float | None], lower_is_better: bool = False) -> dict[str, Any]:
    """Median and quartiles over seeds, a missing value (a seed that never got there) counting as
    the worst, and how many are present; a statistic that falls on a missing value is ``None``.

    Example:
        >>> _stats([3, None, 9, 18, None], lower_is_better=True)
        {'median': 18.0, 'q25': 9.0, 'q75': None, 'n': 3}
    """
    worst = np.inf if lower_is_better else -np.inf
    filled = [worst if v is None else v for v in values]
    figures = np.percentile(filled, [25, 50, 75], method="nearest").tolist() if filled else [np.nan] * 3
    q25, median, q75 = (float(v) if np.isfinite(v) else None for v in figures)
    return {"median": median, "q25": q25, "q75": q75, "n": sum(v is not None for v in values)}


def _config(trial: dict[str, Any]) -> tuple:
    return tuple(sorted(trial["params"].items()))


def config_medians(runs: Sequence[dict[str, Any]]) -> dict[tuple, float]:
    """Each measured configuration's ``lat_diff``: the median of all its measurements in ``runs``.

    The best of hundreds of noisy readings is an outlier (on silero_vad the top reading, 1.87, is
    of a configuration whose eleven readings have median 1.81): judged by it, every method's best of
    20 readings falls short. A configuration's median over every study that measured it is what a
    user who picks it gets.

    Example:
        >>> run = {"trials": [{"state": "COMPLETE", "params": {"x": 1}, "lat_diff": v} for v in (1.8, 1.9, 2.3)]}
        >>> config_medians([run])
        {(('x', 1),): 1.9}
    """
    readings: dict[tuple, list[float]] = {}
    for run in runs:
        for trial in run.get("trials", []):
            if trial["state"] == "COMPLETE" and "params" in trial:
                readings.setdefault(_config(trial), []).append(trial["lat_diff"])
    return {config: float(np.median(values)) for config, values in readings.items()}


def by_config(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` with each trial's ``lat_diff`` replaced by its configuration's median (:func:`config_medians`)."""
    medians = config_medians(runs)

    def settle(trial: dict[str, Any]) -> dict[str, Any]:
        if trial["state"] != "COMPLETE" or "params" not in trial:
            return trial
        return {**trial, "lat_diff": medians[_config(trial)]}

    return [{**run, "trials": [settle(t) for t in run["trials"]]} if "trials" in run else run for run in runs]


def best_any(runs: Sequence[dict[str, Any]], acc_th: float) -> float | None:
    """The best ``lat_diff`` within ``acc_th`` that any study trial or baseline in ``runs`` reached."""
    found = [t["lat_diff"] for r in runs if "trials" in r for t in within_target(r["trials"], acc_th)]
    found += [r["lat_diff"] for r in runs if "trials" not in r and r["acc_loss"] <= acc_th]
    return max(found) if found else None


def at_bar(seeds: Sequence[dict[str, Any]], acc_th: float) -> list[float | None]:
    """Per seed, the best ``lat_diff`` within ``acc_th`` after :data:`BAR_TRIALS` trials."""
    return [best_within(r["trials"], acc_th, BAR_TRIALS) for r in seeds]


def ratios(values: Sequence[float | None], best: float | None) -> list[float | None]:
    """``values`` over ``best``, a missing one staying missing."""
    return [None if v is None or best is None else v / best for v in values]


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    """Per method, the figures of the docs' tables; and the issue's bar for each tuning method.

    The bar is judged twice: on the readings as measured, and by configuration (:func:`by_config`).
    """
    acc_th, lat_th, budget = report["accuracy_loss"] / 100, report["latency_reduce"], report["trials"]
    runs = [r for r in report["runs"] if "error" not in r]
    errors = {f"{r['method']}/{r['seed']}": r["error"] for r in report["runs"] if "error" in r}
    settled = by_config(runs)
    best, best_settled = best_any(runs, acc_th), best_any(settled, acc_th)
    methods: dict[str, Any] = {}
    baselines = {
        run["method"]: {k: run[k] for k in ("acc_loss", "lat_diff", "spread", "wall_s", "peak_rss_mb", "int8_layers", "fp32_layers")}
        for run in runs
        if "trials" not in run
    }
    meeting = [b["lat_diff"] for b in baselines.values() if b["acc_loss"] <= acc_th]
    for method in dict.fromkeys(r["method"] for r in runs if "trials" in r):
        seeds = [r for r in runs if r["method"] == method]
        hits = [first_hit(r["trials"], acc_th, lat_th) for r in seeds]
        reached = at_bar(seeds, acc_th)
        as_read = ratios(reached, best)
        by_configuration = ratios(at_bar([r for r in settled if r["method"] == method], acc_th), best_settled)
        methods[method] = {
            "seeds": len(seeds),
            "best_lat_diff": {n: _stats([best_within(r["trials"], acc_th, n) for r in seeds]) for n in checkpoints(budget)},
            "trials_to_target": _stats([None if h is None else h["number"] + 1 for h in hits], lower_is_better=True),
            "seconds_to_target": _stats([None if h is None else h["elapsed_s"] for h in hits], lower_is_better=True),
            "peak_rss_mb": _stats([r["peak_rss_mb"] for r in seeds]),
            "wall_s": _stats([r["wall_s"] for r in seeds]),
            "setup_s": _stats([r.get("setup_s") for r in seeds], lower_is_better=True),
            "reference_s": _stats([r["trials"][0]["elapsed_s"] for r in seeds]),
            "calibration_s": _stats([sum(r["calibration_s"].values()) for r in seeds]),
            "prior_s": _stats([r["prior_s"] for r in seeds]),
            "bar": {
                "ratio_at_20": _stats(as_read),
                "seeds_at_95pct": sum(x is not None and x >= BAR_FRACTION for x in as_read),
                "ratio_at_20_by_config": _stats(by_configuration),
                "seeds_at_95pct_by_config": sum(x is not None and x >= BAR_FRACTION for x in by_configuration),
                "beats_baselines": None if not meeting else sum(v is not None and v > max(meeting) for v in reached),
            },
        }
    return {"best_any": best, "best_any_by_config": best_settled, "methods": methods, "baselines": baselines, "errors": errors}


def _fmt(stats: dict[str, Any], digits: int = 2) -> str:
    if stats["median"] is None:
        return "-" if stats["n"] == 0 else f"- ({stats['n']} hit)"
    q25, q75 = ("-" if q is None else f"{q:.{digits}f}" for q in (stats["q25"], stats["q75"]))
    return f"{stats['median']:.{digits}f} [{q25}, {q75}]"


def format_summary(report: dict[str, Any]) -> str:
    """Markdown tables of :func:`summarise`: medians over seeds with [25th, 75th] percentiles.

    "wall s" is a whole study's time, ``create_study`` and every trial; "setup s" is
    ``create_study``'s own time (loading, preparing and checking the model, the
    fp32 session); "reference s" is the time from ``create_study`` to the end of the reference trial (export,
    fp32 evaluation, calibration and measurement of the default configuration); "calibration s"
    is all calibration of the study, the later methods' (Percentile, Entropy) included.
    """
    summary = summarise(report)
    counts = checkpoints(report["trials"])
    workload = report.get("workload") or {}  # None while every run has failed
    lines = [
        f"**{report['model']}**: {workload.get('source', '')}; score: "
        f"{workload.get('score', '')}. Targets: acc_loss <= {report['accuracy_loss']} %, "
        f"lat_diff >= {report['latency_reduce']}; {report['trials']} trials; CPU int8 class "
        f"{report.get('int8_class') or 'not recorded'}.",
        "",
        "| method | seeds | " + " | ".join(f"best lat_diff @{n}" for n in counts)
        + " | trials to target | s to target | @20 / best any | same, by config | peak MB | wall s | setup s"
        " | reference s | calibration s | prior s |",
        "|---" * (12 + len(counts)) + "|",
    ]
    for method, m in summary["methods"].items():
        cells = [method, str(m["seeds"])]
        cells += [_fmt(m["best_lat_diff"][n]) for n in counts]
        cells += [_fmt(m["trials_to_target"], 0), _fmt(m["seconds_to_target"], 0), _fmt(m["bar"]["ratio_at_20"])]
        cells += [_fmt(m["bar"]["ratio_at_20_by_config"])]
        cells += [_fmt(m["peak_rss_mb"], 0), _fmt(m["wall_s"], 1), _fmt(m["setup_s"], 1), _fmt(m["reference_s"], 1), _fmt(m["calibration_s"], 1), _fmt(m["prior_s"], 1)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| baseline | acc_loss % | lat_diff (spread) | int8 / fp32 layers | wall s | peak MB |", "|---|---|---|---|---|---|"]
    for name, b in summary["baselines"].items():
        lines.append(
            f"| {name} | {100 * b['acc_loss']:.2f} | {b['lat_diff']:.2f} ({b['spread']:.2f}) | "
            f"{b['int8_layers']} / {b['fp32_layers']} | {b['wall_s']:.1f} | {b['peak_rss_mb']:.0f} |"
        )
    best, settled = (summary[k] for k in ("best_any", "best_any_by_config"))
    lines += [
        "",
        f"Best lat_diff within the accuracy target, any method, any budget: {'-' if best is None else f'{best:.2f}'}; "
        f"by configuration (each the median of all its readings): {'-' if settled is None else f'{settled:.2f}'}.",
    ]
    for method, m in summary["methods"].items():
        beats = m["bar"]["beats_baselines"]
        seeds = m["seeds"]
        lines.append(
            f"- {method}: best within target after {BAR_TRIALS} trials >= {BAR_FRACTION:.0%} of that in "
            f"{m['bar']['seeds_at_95pct']}/{seeds} seeds ({m['bar']['seeds_at_95pct_by_config']}/{seeds} by configuration); "
            "beats every baseline that meets the target in "
            + ("(no baseline meets it)" if beats is None else f"{beats}/{seeds}")
            + " seeds."
        )
    lines += [f"- {name} failed: {error}" for name, error in summary["errors"].items()]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_models.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="workload name (benchmarks.real_models.workloads.WORKLOADS)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 of each tuning method")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=40, help="trials per study, the reference included")
    parser.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated, from {', '.join(METHODS)} (default: all but the peers {', '.join(PEERS)})",
    )
    parser.add_argument("--latency-reduce", type=float, help="latency target; default: the model's in LATENCY_TARGETS")
    parser.add_argument("--eval-size", type=int, help="evaluation samples (default: the workload's)")
    parser.add_argument("--calibration-size", type=int, help="calibration samples (default: the workload's)")
    parser.add_argument("--out", type=Path, help="JSON file the runs are merged into")
    parser.add_argument("--save-models", type=Path, metavar="DIR", help="write each baseline's int8 model into DIR")
    parser.add_argument("--summary", type=Path, metavar="JSON", help="print the tables of a stored report and exit")
    parser.add_argument(
        "--merge", type=Path, nargs="+", metavar="JSON", help="merge these reports' runs into --out (later ones win) and exit"
    )
    args = parser.parse_args(argv)
    if args.merge is not None and args.out is None:
        parser.error("--merge needs --out, the report the runs are merged into.")
    if args.summary is None and args.merge is None:
        if args.model is None or args.out is None:
            parser.error("--model and --out are required (or --summary JSON).")
        unknown = set(args.methods.split(",")) - set(METHODS)
        if unknown:
            parser.error(f"unknown method(s) {sorted(unknown)}; choose from {list(METHODS)}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the requested studies and baselines (or print a stored report's tables)."""
    args = parse_args(argv)
    if args.summary is not None:
        report = json.loads(args.summary.read_text())
        print(format_summary(report))
        return report
    if args.merge is not None:
        report = merge(args.out, args.merge)
        print(format_summary(report))
        return report
    sizes = {k: v for k, v in (("n_eval", args.eval_size), ("n_calibration", args.calibration_size)) if v is not None}
    ran_with = versions()
    header = {
        "model": args.model,
        "settings": {"benchmark": asdict(SETTINGS), "sizes": sizes},
        "accuracy_loss": ACCURACY_LOSS,
        "latency_reduce": args.latency_reduce or LATENCY_TARGETS[args.model],
        "trials": args.trials,
        "int8_class": ran_with["int8_class"],
        "versions": ran_with,
    }
    report = load_report(args.out, header)
    report["versions"] = header["versions"]
    for method in args.methods.split(","):
        seeds = [0] if method in BASELINES else range(args.first_seed, args.first_seed + args.seeds)
        for seed in seeds:
            if method in BASELINES:
                run = in_fresh_process(run_baseline, args.model, method, sizes, args.save_models)
            else:
                run = in_fresh_process(run_study, args.model, method, seed, args.trials, report["latency_reduce"], sizes)
            run.update(method=method, seed=seed)
            report["workload"] = run.pop("workload", report.get("workload"))
            store(args.out, report, run)
            outcome = run.get("error") or f"wall {run['wall_s']:.0f} s, peak {run['peak_rss_mb']:.0f} MB"
            print(f"{args.model} {method} seed {seed}: {outcome}", flush=True)
    print(format_summary(report))
    return report


if __name__ == "__main__":
    main()
