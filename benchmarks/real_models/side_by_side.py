"""The best configuration the studies of a report found, re-timed beside other int8 models in one
process, round after round: the ratios of the real-model tables come from different processes
at different loads, these from the same minutes.

The study's configuration is picked among the ``--candidates`` configurations with the best
median ``lat_diff`` over all their readings in the report, every reading within the accuracy
target and the model quantized (:func:`benchmarks.real_models.run.config_medians`), each building
another model than the ones before it (:meth:`~optuna_quant.trial.space.SearchSpace.to_config`): each is built by
``create_study``'s objective from its parameters as a trial builds it and timed for
``--select-rounds`` rounds of its own, and the best of those medians goes on. A configuration that
one study read once ranks on that one reading; re-timing the first few keeps a lucky reading from
deciding, and the rounds below do not reuse the selection's readings, so that the pick's figure is
not the best of a few noisy medians. ``--reference`` adds the study's reference configuration (its
first trial: every layer int8). The others are baselines
built in this process (:data:`benchmarks.real_models.baselines.BASELINES`) and int8 files that
other environments wrote (``run --save-models``: the peers of ``make peers``). Every model
is scored once with the workload's ``eval_fn`` (deterministic), and each round times every model
once against fp32, in turn (:func:`benchmarks.real_models.baselines.time_against_fp32`); the
medians over rounds are printed.

Example:
    python -m benchmarks.real_models.side_by_side --model ppocr --report benchmarks/results/real_ppocr.json \\
        --files inc=/tmp/ppocr-inc.onnx --rounds 5 --out benchmarks/results/side_by_side_ppocr.json
"""

from __future__ import annotations

import os


# One thread per process, as the runner times.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Hashable  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import asdict  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import optuna  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.real_models.base import Workload  # noqa: E402
from benchmarks.real_models.baselines import BASELINES  # noqa: E402
from benchmarks.real_models.baselines import measure  # noqa: E402
from benchmarks.real_models.baselines import time_against_fp32  # noqa: E402
from benchmarks.real_models.run import ACCURACY_LOSS  # noqa: E402
from benchmarks.real_models.run import config_medians  # noqa: E402
from benchmarks.real_models.run import quantized  # noqa: E402
from benchmarks.real_models.run import SETTINGS  # noqa: E402
from benchmarks.real_models.workloads import build  # noqa: E402
import optuna_quant  # noqa: E402


def top_configurations(
    report: dict[str, Any], count: int, same: Callable[[dict[str, Any]], Hashable] | None = None
) -> list[tuple[dict[str, Any], float]]:
    """The parameters of the report's ``count`` configurations with the best median ``lat_diff``
    among those that quantize something and whose every reading meets the accuracy target, each
    with that median, best first. Configurations that ``same`` maps to one key (one model, say:
    under the dynamic approach a convolution's layer choice builds nothing else) count once, by
    the best of them.

    Raises:
        ValueError: If no study trial of the report meets the target with a quantized model.
    """
    acc_th = report["accuracy_loss"] / 100
    runs = [r for r in report["runs"] if "trials" in r]
    excluded = {
        tuple(sorted(t["params"].items()))
        for r in runs
        for t in r["trials"]
        if t["state"] == "COMPLETE" and (t["acc_loss"] is None or t["acc_loss"] > acc_th or not quantized(t))
    }
    medians = {config: value for config, value in config_medians(runs).items() if config not in excluded}
    if not medians:
        raise ValueError(
            f"No study trial of the {report['model']} report meets acc_loss <= {acc_th} with a model that "
            "quantizes something."
        )
    ranked: list[tuple] = []
    keys: set[Hashable] = set()
    for config in sorted(medians, key=medians.__getitem__, reverse=True):
        key = config if same is None else same(dict(config))
        if key not in keys and len(ranked) < count:
            keys.add(key)
            ranked.append(config)
    return [(dict(config), medians[config]) for config in ranked]


@contextmanager
def open_study(workload: Workload) -> Iterator[optuna_quant.QuantStudy]:
    """An in-memory study of ``workload``, whose objective builds models as a trial does."""
    with tempfile.TemporaryDirectory() as folder:
        yield optuna_quant.create_study(
            **workload.study_kwargs(),
            accuracy_loss=ACCURACY_LOSS,
            storage=optuna.storages.InMemoryStorage(),
            benchmark=asdict(SETTINGS),
            artifact_dir=folder,
        )


def full_params(study: optuna_quant.QuantStudy, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every parameter left out at its reference choice (``{}`` is the study's
    reference trial; a report made before a scope existed lacks it), as the code of that report had it."""
    return {**study.objective.space.default_params(), **params}


def study_models(
    study: optuna_quant.QuantStudy, configurations: dict[str, dict[str, Any]]
) -> dict[str, tuple[onnx.ModelProto, dict[str, Any]]]:
    """Per name, the int8 model of the configuration's parameters, built by ``study``'s objective
    as a trial builds it, and the parameters it was built from (:func:`full_params`)."""
    built = {}
    for name, params in configurations.items():
        params = full_params(study, params)
        built[name] = (study.objective.build(params), params)
    return built


def retime(workload: Workload, models: dict[str, onnx.ModelProto], rounds: int) -> dict[str, Any]:
    """Every model scored once and timed once per round, in turn; per model its ``acc_loss``, its
    readings and their median."""
    measured = {name: measure(workload, model, SETTINGS) for name, model in models.items()}
    readings = {name: [row["lat_diff"]] for name, row in measured.items()}
    for _ in range(rounds - 1):
        for name, model in models.items():
            readings[name].append(time_against_fp32(workload, model, SETTINGS).lat_diff)
    return {
        name: {
            "acc_loss": row["acc_loss"],
            "lat_diff": float(np.median(readings[name])),
            "lat_diffs": readings[name],
            "int8_layers": row["int8_layers"],
            "fp32_layers": row["fp32_layers"],
        }
        for name, row in measured.items()
    }


def pick(workload: Workload, models: dict[str, onnx.ModelProto], rounds: int) -> tuple[str, dict[str, Any]]:
    """The name of the model with the best median ``lat_diff`` over ``rounds`` rounds of their own
    among those within the accuracy target as scored here (among all when none is), and every
    model's readings (:func:`retime`); a single model is taken untimed."""
    if len(models) == 1:
        return next(iter(models)), {}
    readings = retime(workload, models, rounds)
    within = [name for name, row in readings.items() if row["acc_loss"] <= ACCURACY_LOSS / 100] or list(readings)
    return max(within, key=lambda name: readings[name]["lat_diff"]), readings


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real_models.side_by_side", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", required=True, help="workload name (benchmarks.real_models.workloads.WORKLOADS)")
    parser.add_argument(
        "--report", type=Path, help="a report of the runner whose best study configurations are picked among"
    )
    parser.add_argument("--reference", action="store_true", help="also the study's reference configuration")
    parser.add_argument("--baselines", nargs="*", default=[], help=f"baselines built here, from {', '.join(BASELINES)}")
    parser.add_argument("--files", nargs="*", default=[], metavar="NAME=PATH", help="int8 ONNX files written elsewhere")
    parser.add_argument("--candidates", type=int, default=3, help="the report's best configurations to pick among")
    parser.add_argument("--select-rounds", type=int, default=3, help="rounds that time the candidates, before --rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="JSON file for the readings")
    args = parser.parse_args(argv)
    unknown = set(args.baselines) - set(BASELINES)
    if unknown:
        parser.error(f"unknown baseline(s) {sorted(unknown)}; choose from {list(BASELINES)}")
    bad = [item for item in args.files if "=" not in item]
    if bad:
        parser.error(f"--files takes NAME=PATH, not {bad}")
    for option in ("candidates", "select_rounds", "rounds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be positive, not {getattr(args, option)}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Build the models, re-time them side by side and print one line each."""
    args = parse_args(argv)
    missing = [path for _, path in (item.split("=", 1) for item in args.files) if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(f"No such int8 model file: {missing}")
    workload = build(args.model)
    models: dict[str, onnx.ModelProto] = {}
    result: dict[str, Any] = {
        "model": args.model,
        "rounds": args.rounds,
        "select_rounds": args.select_rounds,
        "versions": versions(),
    }
    configurations: dict[str, dict[str, Any]] = {"study reference": {}} if args.reference else {}
    with open_study(workload) as study:
        def model_of(params: dict[str, Any]) -> Hashable:
            return study.objective.space.to_config(full_params(study, params))

        report = None if args.report is None else json.loads(args.report.read_text())
        candidates = [] if report is None else top_configurations(report, args.candidates, model_of)
        names = [f"candidate {rank}" for rank in range(1, len(candidates) + 1)]
        configurations.update(zip(names, (params for params, _ in candidates)))
        built = study_models(study, configurations)
    if candidates:
        chosen, selection = pick(workload, {name: built[name][0] for name in names}, args.select_rounds)
        built["study best"] = built[chosen]
        result["report_median"] = candidates[names.index(chosen)][1]
        result["candidates"] = {
            name: {"params": params, "report_median": median, "chosen": name == chosen, **selection.get(name, {})}
            for name, (params, median) in zip(names, candidates)
        }
    for name in ("study reference", "study best"):
        if name in built:
            models[name] = built[name][0]
            result.setdefault("params", {})[name] = built[name][1]
    for name in args.baselines:
        models[name] = BASELINES[name](workload)[0]
    for name, path in (item.split("=", 1) for item in args.files):
        models[name] = onnx.load(path)
    result["models"] = retime(workload, models, args.rounds)
    timed = {
        **{f"{name} (selection)": row for name, row in result.get("candidates", {}).items() if "lat_diffs" in row},
        **result["models"],
    }
    for name, row in timed.items():
        print(
            f"{name}: lat_diff {row['lat_diff']:.3f} (median of {len(row['lat_diffs'])}; "
            f"{min(row['lat_diffs']):.3f}-{max(row['lat_diffs']):.3f}), acc_loss {100 * row['acc_loss']:.2f} %, "
            f"{row['int8_layers']} int8 / {row['fp32_layers']} fp32 layers",
            flush=True,
        )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
