"""The ``optuna-quant`` command: tune, join, export, watch and report a study from a config file.

Commands::

    optuna-quant probe CONFIG                measure fp32 and the reference int8 model, suggest targets
    optuna-quant tune CONFIG                 run the study the config describes
    optuna-quant worker CONFIG               join that study from another process or machine
    optuna-quant best CONFIG --export PATH   rebuild and export the stored best model
    optuna-quant dashboard CONFIG            optuna-dashboard on the study's storage
    optuna-quant report CONFIG --out FILE    a self-contained HTML report

Global options: ``--verbose`` (Optuna's per-trial lines, onnxruntime's quantization warnings and
the traceback of an error); ``tune`` and ``worker`` take ``--no-progress`` (no progress bar).

Exit status: 0 on success, 1 when a run completed no trial, 2 for any error (one line on stderr
naming the problem; the traceback only with ``--verbose``), 130 when interrupted.

Example:
    >>> main(["tune", "examples/demo_config.yaml"])   # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from collections.abc import Sequence
import logging
import sys
import traceback
from typing import NoReturn

import optuna

from optuna_quant import logs
from optuna_quant.cli.config import ConfigError
from optuna_quant.cli.config import load_config
from optuna_quant.cli.config import RunConfig
from optuna_quant.cli.probe import probe
from optuna_quant.cli.probe import run_probe
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import NotWritableError
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.urls import describe
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.urls import StorageError
from optuna_quant.study import create_study
from optuna_quant.study import QuantStudy
from optuna_quant.trial.records import reference_scaling
from optuna_quant.trial.records import stored_sensitivity
from optuna_quant.trial.results import BestResult
from optuna_quant.visualization.dashboard import DEFAULT_HOST
from optuna_quant.visualization.dashboard import DEFAULT_PORT
from optuna_quant.visualization.dashboard import serve
from optuna_quant.visualization.dashboard import study_url
from optuna_quant.visualization.report import write_report


_VERBOSE_HINT = "--verbose shows them"


class UsageError(Exception):
    """A command that cannot run as asked; reported in one line with exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) and return the exit status.

    The logging it sets for the run is put back on return, for callers in the same process.
    """
    args = _parser().parse_args(argv)
    with logs.restored():
        # POT's log lines are the progress of a run; Optuna's per-trial line, listing every
        # parameter, and onnxruntime's per-node warnings only with --verbose.
        logs.set_verbosity(logging.DEBUG if args.verbose else logging.INFO)
        optuna.logging.set_verbosity(optuna.logging.INFO if args.verbose else optuna.logging.WARNING)
        try:
            return args.command(args)
        except KeyboardInterrupt:
            print("optuna-quant: interrupted", file=sys.stderr)
            return 130
        except Exception as err:  # noqa: BLE001 - every error is one line; --verbose adds the traceback
            if args.verbose:
                traceback.print_exc()
            print(f"optuna-quant: error: {_one_line(err)}", file=sys.stderr)
            return 2


def _one_line(err: Exception) -> str:
    """The error as one line: a usage error's message, else its type and message, hinting at
    ``--verbose`` for the traceback."""
    message = " ".join(str(err).split())
    if isinstance(err, UsageError):
        return message
    return f"{type(err).__name__}: {message} (--verbose shows the traceback)"


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    verbose_help = "show Optuna's per-trial lines, onnxruntime's warnings and the traceback of an error"
    parser = _Parser(
        prog="optuna-quant", description="Tune post-training int8 quantization of ONNX models with Optuna."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    # --verbose also after the command; SUPPRESS keeps a flag given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose_help)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, run: Callable[[argparse.Namespace], int], summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary, parents=[common])
        sub.set_defaults(command=run)
        return sub

    command("probe", _probe, "Measure fp32 and the reference int8 model; suggest targets. Stores nothing.").add_argument(
        "config", metavar="CONFIG"
    )
    for name, run, summary in (
        ("tune", _tune, "Run the study that CONFIG describes."),
        ("worker", _worker, "Join the existing study of CONFIG (same storage)."),
    ):
        sub = command(name, run, summary)
        sub.add_argument("config", metavar="CONFIG")
        sub.add_argument("--no-progress", action="store_true", help="no progress bar")
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


def _run(config: RunConfig, study: QuantStudy, progress: bool) -> int:
    max_trials, max_minutes = config.get("max_trials"), config.get("max_minutes")
    try:
        with logs.quiet_onnxruntime(hint=_VERBOSE_HINT):
            best = study.optimize(
                n_trials=max_trials,
                timeout=None if max_minutes is None else max_minutes * 60,
                show_progress_bar=progress,
            )
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


def _checked_run_config(path: str) -> RunConfig:
    """The config of ``tune`` or ``worker``, checked before anything stored is touched."""
    config = _config(path)
    try:
        config.check_run()
    except ConfigError as err:
        raise UsageError(str(err)) from err
    return config


def _probe(args: argparse.Namespace) -> int:
    config = _config(args.config)
    try:
        kwargs = config.measure_kwargs()
    except ConfigError as err:
        raise UsageError(str(err)) from err
    try:
        with logs.quiet_onnxruntime(hint=_VERBOSE_HINT):
            report = probe(**kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise UsageError(f"{config.path}: {err}") from err
    print(report.report())
    return 0


def _tune(args: argparse.Namespace) -> int:
    config = _checked_run_config(args.config)
    study = _study(config)
    if reference_scaling(study.study) is None:  # a new study: say what to expect before its first trial
        with logs.quiet_onnxruntime(hint=_VERBOSE_HINT):
            report = run_probe(study.objective, stored_sensitivity(study.study))
        print(report.report(), flush=True)
    code = _run(config, study, progress=not args.no_progress)
    if code == 0:
        print(f"Watch the study: optuna-quant dashboard {args.config}")
    return code


def _worker(args: argparse.Namespace) -> int:
    config = _checked_run_config(args.config)
    _require_study(config)
    # The config's study, a fine-tune one included: warm_start takes the space it stored.
    return _run(config, _study(config, "warm_start"), progress=not args.no_progress)


def _best(args: argparse.Namespace) -> int:
    config = _config(args.config)
    path = args.export or config.get("export")
    if not path:
        raise UsageError(f"{config.path}: give --export PATH or 'export' in the config.")
    _check_writable(path, "--export" if args.export else f"{config.path}: export")
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
    _check_writable(args.out, "--out")
    study = _require_study(config)
    try:
        path = write_report(study, args.out)
    except ValueError as err:
        raise UsageError(f"{config.path}: {err}") from err
    print(f"Wrote the report of study {study.study_name!r} to {path}")
    return 0


def _check_writable(path: str, what: str) -> None:
    try:
        check_writable(path, what)
    except NotWritableError as err:
        raise UsageError(str(err)) from err


def _print_best(best: BestResult) -> None:
    print(best.summary())
    print(best.configuration())


def _export(study: QuantStudy, path: str, best: BestResult) -> None:
    study.export_best(path, best)
    print(f"Exported the int8 model to {path}")

