"""The demo model's probe and study on the CPU this runs on, recorded by its int8 class.

On one machine: the probe of the demo's MNIST CNN, then ``make demo``'s study (TPE with the
prior, targets 1 % and 1.5x, ``--trials`` trials, every trial run) in an SQLite file, and the
exported model's metadata. With ``--resume`` it then joins, as a ``warm_start`` worker, the study
that another machine stored in the SQLite file given (carried here): a worker of another int8
class must be refused before it runs a trial, and the study must keep only the trials of its own
class::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_cpu_class --trials 20 --storage cpu_class.db
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_cpu_class --trials 20 --storage here.db --resume cpu_class.db

Results go to ``benchmarks/results/cpu_classes.json``, one entry per machine, keyed by ``--label``
(by default the int8 class).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
import json
import os
from pathlib import Path
import tempfile
from typing import Any

import onnx
import optuna

from benchmarks._versions import versions
from examples.demo import ACCURACY_LOSS
from examples.demo import demo_study
from examples.demo import LATENCY_REDUCE
import optuna_quant as oq
from optuna_quant.cli.probe import run_probe
from optuna_quant.measure.cpu import int8_support
from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import recorded
from optuna_quant.trial.stopping import meets_targets


RESULTS = Path(__file__).parent / "results" / "cpu_classes.json"
STUDY_NAME = "demo-cpu-class"
TARGETS = Targets(accuracy_loss=ACCURACY_LOSS, latency_reduce=LATENCY_REDUCE)


def study_figures(study: optuna.Study) -> dict[str, Any]:
    """The study's trials: the best (POT's rule), the first trial that meets both targets, and
    the int8 class of the workers that ran them."""
    trials = recorded(study.get_trials(deepcopy=False))
    on_target = [t.number for t in trials if meets_targets(t, TARGETS)]
    best = best_trial(trials, TARGETS)
    return {
        "trials": len(trials),
        "classes": dict(Counter(records.worker_int8_class(t) for t in trials)),
        "stored_class": records.stored_int8_class(study),
        "first_on_target": min(on_target) + 1 if on_target else None,
        "best": None
        if best is None
        else {"number": best.number, "acc_loss": records.acc_loss(best), "lat_diff": records.lat_diff(best)},
    }


def exported_metadata(study: oq.QuantStudy) -> dict[str, str]:
    """The ``optuna_quant.*`` metadata of the exported best model."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "best.onnx"
        study.export_best(path)
        model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props if p.key.startswith("optuna_quant.")}


def resume(storage: str) -> dict[str, Any]:
    """Join the study stored in ``storage`` (a storage URL) as a ``warm_start`` worker and run
    one trial more."""
    try:
        study = demo_study(storage, study_name=STUDY_NAME, trials_load_method="warm_start")
    except ValueError as error:
        refused: str | None = str(error)
    else:
        study.optimize(n_trials=len(study.study.trials) + 1)
        refused = None
    print("resume:", refused or "joined", flush=True)
    return {"refused": refused, "study": study_figures(optuna.load_study(study_name=STUDY_NAME, storage=storage))}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="the study's trials; 0: no probe or study here")
    parser.add_argument(
        "--storage", type=Path, default=Path("cpu_class.db"), help="SQLite file of this machine's study"
    )
    parser.add_argument("--resume", type=Path, help="SQLite file of this benchmark's study on another machine")
    parser.add_argument("--label", help="the results' key (default: the int8 class)")
    parser.add_argument("--json", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def tune_here(storage: str, trials: int) -> dict[str, Any]:
    """The probe, a study of ``trials`` trials in ``storage``, and its exported model's metadata."""
    study = demo_study(storage, study_name=STUDY_NAME)
    probe = run_probe(study.objective)
    print(probe.report(), flush=True)
    study.optimize(n_trials=trials)
    figures = study_figures(study.study)
    print(json.dumps(figures), flush=True)
    return {
        "probe": {
            "fp32_accuracy": probe.fp32_accuracy,
            "acc_loss": probe.acc_loss,
            "lat_diff": probe.lat_diff,
            "spread": probe.reference.latency.spread,
            "fp32_ms": probe.reference.latency.fp32_ms,
            "int8_ms": probe.reference.latency.int8_ms,
        },
        "study": figures,
        "exported_metadata": exported_metadata(study),
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.resume is not None and not args.resume.is_file():
        raise SystemExit(f"--resume {args.resume}: no such file")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cpu = int8_support()
    print(cpu.cpu_model, "|", cpu.describe(), flush=True)
    entry: dict[str, Any] = {
        "cpu": cpu.cpu_model,
        "int8_class": cpu.int8_class,
        "instruction_sets": list(cpu.instruction_sets),
        "cores": os.cpu_count(),
        "versions": versions(),
    }
    if args.trials > 0:
        entry.update(tune_here(f"sqlite:///{args.storage}", args.trials))
    if args.resume is not None:
        entry["resume"] = resume(f"sqlite:///{args.resume}")
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    results[args.label or cpu.int8_class] = entry
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
