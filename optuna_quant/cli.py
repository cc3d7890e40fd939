"""The ``optuna-quant`` command: tune, join, export, watch and report a study from a config file.

Commands::

    optuna-quant tune CONFIG                 run the study the config describes
    optuna-quant worker CONFIG               join that study from another process or machine
    optuna-quant best CONFIG --export PATH   rebuild and export the stored best model
    optuna-quant dashboard CONFIG            optuna-dashboard on the study's storage
    optuna-quant report CONFIG --out FILE    a self-contained HTML report

Exit status: 0 on success, 1 when a run completed no trial, 2 for a config or usage error (one
line on stderr, no traceback).

Example:
    >>> main(["tune", "examples/demo_config.yaml"])   # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
import logging
import sys
from typing import NoReturn

import optuna

from optuna_quant.config import ConfigError
from optuna_quant.config import load_config
from optuna_quant.config import RunConfig
from optuna_quant.dashboard import DEFAULT_HOST
from optuna_quant.dashboard import DEFAULT_PORT
from optuna_quant.dashboard import serve
from optuna_quant.dashboard import study_url
from optuna_quant.report import write_report
from optuna_quant.results import BestResult
from optuna_quant.storage import default_artifact_dir
from optuna_quant.storage import describe
from optuna_quant.storage import open_storage
from optuna_quant.storage import sqlite_file
from optuna_quant.storage import StorageError
from optuna_quant.study import create_study
from optuna_quant.study import QuantStudy

_logger = logging.getLogger("optuna_quant")


class UsageError(Exception):
    """A command that cannot run as asked; reported in one line with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:%(name)s:%(message)s")
    _logger.setLevel(logging.INFO)  # POT's log lines are the progress of a run
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return args.command(args)
    except UsageError as err:
        print(f"optuna-quant: error: {err}", file=sys.stderr)
        return 2


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="optuna-quant", description="Tune post-training int8 quantization of ONNX models with Optuna."
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.set_defaults(command=run)
        return sub

    command("tune", _tune, "Run the study that CONFIG describes.").add_argument("config", metavar="CONFIG")
    command("worker", _worker, "Join the existing study of CONFIG (same storage).").add_argument(
        "config", metavar="CONFIG"
    )
    best = command("best", _best, "Rebuild the stored best model, print it and export it.")
    best.add_argument("config", metavar="CONFIG")
    best.add_argument("--export", metavar="PATH", help="the int8 model's path (default: the config's export)")
    dashboard = command("dashboard", _dashboard, "Start optuna-dashboard on the study's storage.")
    dashboard.add_argument("config", metavar="CONFIG", nargs="?")
    dashboard.add_argument("--storage", metavar="URL", help="a storage URL instead of CONFIG")
    dashboard.add_argument("--host", default=DEFAULT_HOST, help=f"default {DEFAULT_HOST}")
    dashboard.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    report = command("report", _report, "Write a self-contained HTML report of the study.")
    report.add_argument("config", metavar="CONFIG")
    report.add_argument("--out", metavar="FILE", default="report.html", help="default report.html")
    return parser


def _config(path: str) -> RunConfig:
    try:
        return load_config(path)
    except ConfigError as err:
        raise UsageError(str(err)) from err


def _study(config: RunConfig, trials_load_method: str | None = None) -> QuantStudy:
    """The study of ``config``; a bad model, data or option is a usage error naming the file."""
    try:
        return create_study(**config.study_kwargs(trials_load_method))
    except ConfigError as err:
        raise UsageError(str(err)) from err
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise UsageError(f"{config.path}: {err}") from err


def _require_study(config: RunConfig) -> optuna.Study:
    """The config's study, which must exist: worker, best and report never start one."""
    missing = UsageError(
        f"{config.path}: no study {config.study_name!r} in {describe(config.storage)}; "
        "run 'optuna-quant tune' first."
    )
    database = sqlite_file(config.storage)
    if database is not None and not database.is_file():
        raise missing  # opening it would create an empty database file
    try:
        return optuna.load_study(study_name=config.study_name, storage=open_storage(config.storage))
    except StorageError as err:
        raise UsageError(f"{config.path}: {err}") from err
    except KeyError as err:
        raise missing from err


def _run(config: RunConfig, study: QuantStudy) -> int:
    max_trials, max_minutes = config.get("max_trials"), config.get("max_minutes")
    if max_trials is None and max_minutes is None:
        raise UsageError(f"{config.path}: give max_trials or max_minutes (or both).")
    try:
        best = study.optimize(n_trials=max_trials, timeout=None if max_minutes is None else max_minutes * 60)
    except ValueError as err:
        # The objective refuses a study made for another model, space or targets.
        raise UsageError(f"{config.path}: {err}") from err
    if best is None:
        print("No trial completed; see the log above.", file=sys.stderr)
        return 1
    _print_best(best)
    if study.node_modules:
        print(f"Layers kept in fp32: {', '.join(study.fallback_modules(best)) or 'none'}")
    if config.get("export"):
        _export(study, config.get("export"), best)
    return 0


def _tune(args: argparse.Namespace) -> int:
    config = _config(args.config)
    study = _study(config)
    code = _run(config, study)
    if code == 0:
        print(f"Watch the study: optuna-quant dashboard {args.config}")
    return code


def _worker(args: argparse.Namespace) -> int:
    config = _config(args.config)
    _require_study(config)
    # The config's study, a fine-tune one included: warm_start takes the space it stored.
    return _run(config, _study(config, "warm_start"))


def _best(args: argparse.Namespace) -> int:
    config = _config(args.config)
    path = args.export or config.get("export")
    if not path:
        raise UsageError(f"{config.path}: give --export PATH or 'export' in the config.")
    _require_study(config)
    study = _study(config, "eval")
    best = study.best_result
    if best is None:
        raise UsageError(f"{config.path}: study {config.study_name!r} has no completed trial.")
    _print_best(best)
    _export(study, path, best)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.storage is None):
        raise UsageError("give CONFIG or --storage URL.")
    url = f"http://{args.host}:{args.port}/dashboard"
    config = None if args.config is None else _config(args.config)
    try:
        storage = open_storage(args.storage if config is None else config.storage)
        if config is not None:
            url = study_url(storage, config.study_name, args.host, args.port)
    except StorageError as err:
        raise UsageError(str(err) if config is None else f"{config.path}: {err}") from err
    except KeyError:
        pass  # the study appears on the dashboard's front page once a run creates it
    artifact_dir = default_artifact_dir(storage) if config is None else config.artifact_dir(storage)
    print(f"optuna-dashboard on {describe(storage)}: {url}", flush=True)
    serve(storage, host=args.host, port=args.port, artifact_dir=artifact_dir)
    return 0


def _report(args: argparse.Namespace) -> int:
    config = _config(args.config)
    study = _require_study(config)
    try:
        path = write_report(study, args.out)
    except ValueError as err:
        raise UsageError(f"{config.path}: {err}") from err
    print(f"Wrote the report of study {study.study_name!r} to {path}")
    return 0


def _print_best(best: BestResult) -> None:
    print(best.summary())
    print(best.configuration())


def _export(study: QuantStudy, path: str, best: BestResult) -> None:
    study.export_best(path, best)
    print(f"Exported the int8 model to {path}")


if __name__ == "__main__":
    sys.exit(main())
