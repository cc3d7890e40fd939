"""The run configuration file of ``optuna-quant``: POT's option names plus the model, data and study.

A config file is YAML (or JSON, for a ``.json`` file) holding one mapping. Every key is checked
before any long work starts: an unknown key is an error that names it, the file and the closest
known key; a value of the wrong type names its key. Relative paths (and the file of a
``sqlite:///`` storage) resolve against the config file's folder, so a run does not depend on the
directory it is started from.

``model``, ``calibration_data`` and ``eval_data`` are files or Python entry points
``module:function``: the function is called without arguments and returns the value. ``eval_fn``
names the evaluation function itself. Entry points are imported with the config file's folder and
the current directory on ``sys.path``.

Example:
    >>> cfg = load_config("examples/demo_config.yaml")   # doctest: +SKIP
    >>> cfg.max_trials, cfg.study_name                   # doctest: +SKIP
    (40, 'mnist-cnn-int8')
    >>> study = create_study(**cfg.study_kwargs())       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
import difflib
import importlib
import inspect
import json
from pathlib import Path
import re
import sys
from typing import Any

import numpy as np
from optuna.storages import BaseStorage
from sqlalchemy.engine import make_url
import yaml

from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.trial.objective import OBJECTIVE_MODES
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import NotWritableError
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import DEFAULT_STORAGE
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.study import create_study
from optuna_quant.study.study import FINE_TUNE_SUFFIX
from optuna_quant.study.study import TRIALS_LOAD_METHODS

_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_integer(value: Any) -> bool:
    return _integer(value) and value > 0


def _positive(value: Any) -> bool:
    return _number(value) and value > 0


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _metrics(value: Any) -> bool:
    return _number(value) or (isinstance(value, list) and bool(value) and isinstance(value[0], Mapping))


def _eval_data(value: Any) -> bool:
    return isinstance(value, str) or (_strings(value) and len(value) == 2)


# Each key with the check of its value and what the check expects, for the error message.
KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_trials": (_positive_integer, "a positive integer"),
    "max_minutes": (_positive, "a positive number"),
    "trials_load_method": (lambda v: v in TRIALS_LOAD_METHODS, f"one of {', '.join(TRIALS_LOAD_METHODS)}"),
    "accuracy_loss": (_number, "a number (percent)"),
    "latency_reduce": (_number, "a number"),
    "accuracy_weight": (_number, "a number"),
    "latency_weight": (_number, "a number"),
    "stop_on_target": (lambda v: isinstance(v, bool), "true or false"),
    "eval_subset_size": (_positive_integer, "a positive integer"),
    "metrics": (_metrics, "a number or a list of {name, baseline_value}"),
    "benchmark": (lambda v: isinstance(v, Mapping), "a mapping of benchmark settings"),
    "model": (_string, "a file path or an entry point module:function"),
    "calibration_data": (_string, "a .npy/.npz file or an entry point module:function"),
    "eval_data": (_eval_data, "a .npz file, two .npy files or an entry point module:function"),
    "eval_fn": (lambda v: _string(v) and bool(_ENTRY_POINT.match(v)), "an entry point module:function"),
    "sampler": (_string, "a sampler name (tpe, gp, random)"),
    "seed": (_integer, "an integer"),
    "storage": (_string, "an Optuna storage URL"),
    "study_name": (_string, "a string"),
    "scopes": (_strings, "a list of scope names"),
    "nodes": (_strings, "a list of node names"),
    "export": (_string, "a file path"),
    "objective_mode": (lambda v: v in OBJECTIVE_MODES, f"one of {', '.join(OBJECTIVE_MODES)}"),
    "artifact_dir": (_string, "a folder path"),
    "pre_process": (lambda v: isinstance(v, bool), "true or false"),
    "sensitivity": (lambda v: isinstance(v, bool), "true or false"),
}
# Keys passed to create_study unchanged when given.
_STUDY_KEYS = (
    "accuracy_loss", "latency_reduce", "accuracy_weight", "latency_weight", "stop_on_target",
    "sampler", "seed", "scopes", "nodes", "objective_mode", "artifact_dir", "pre_process", "sensitivity",
)
DEFAULT_STUDY_NAME: str = inspect.signature(create_study).parameters["study_name"].default


@dataclass(frozen=True)
class RunConfig:
    """A checked config file. Values the file leaves out are ``None`` (create_study's defaults).

    Attributes:
        path: The config file.
        values: The file's keys and values, checked, with paths made absolute.
    """

    path: Path
    values: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the file leaves it out."""
        return self.values.get(key, default)

    @property
    def folder(self) -> Path:
        """The folder that relative paths resolve against."""
        return self.path.resolve().parent

    @property
    def storage(self) -> str:
        """The storage URL; by default ``optuna_quant.db`` beside the config file."""
        return self.get("storage", _resolve_storage(DEFAULT_STORAGE, self.folder))

    def artifact_dir(self, storage: BaseStorage) -> Path:
        """Where the study's best models are stored: ``artifact_dir``, else beside ``storage``."""
        return default_artifact_dir(storage, self.values.get("artifact_dir"))

    @property
    def study_name(self) -> str:
        """The study the config runs: ``study_name``, with ``-fine_tune`` under fine_tune."""
        name = self.get("study_name", DEFAULT_STUDY_NAME)
        return name + FINE_TUNE_SUFFIX if self.get("trials_load_method") == "fine_tune" else name

    def error(self, message: str) -> ConfigError:
        """A :class:`ConfigError` whose message starts with the file."""
        return _error(self.path, message)

    def check_run(self) -> None:
        """Check what ``tune`` and ``worker`` need beyond the keys' types, before anything is stored:
        a budget (``max_trials`` or ``max_minutes``) and writable ``export`` and ``artifact_dir``.

        Raises:
            ConfigError: Naming the file, the key and the problem.
        """
        if self.get("max_trials") is None and self.get("max_minutes") is None:
            raise self.error("give max_trials or max_minutes (or both).")
        try:
            if self.get("export"):
                check_writable(self.get("export"), "export")
            check_writable(self.artifact_dir(self.storage), "artifact_dir", folder=True)
        except NotWritableError as err:
            raise self.error(str(err)) from err

    def measure_kwargs(self) -> dict[str, Any]:
        """The model, data and measuring settings: what :func:`optuna_quant.cli.probe.probe` takes,
        and :meth:`study_kwargs` adds the study to. Nothing is stored or opened.

        Raises:
            ConfigError: For a missing key, a missing file or an entry point that does not import.
        """
        for key in ("model", "calibration_data"):
            if key not in self.values:
                raise self.error(f"{key!r} is missing.")
        if ("eval_data" in self.values) == ("eval_fn" in self.values):
            raise self.error("give exactly one of 'eval_data' and 'eval_fn'.")
        kwargs: dict[str, Any] = {
            "model": self._model(),
            "calibration_data": self._calibration_data(),
            "benchmark": self.get("benchmark"),
            "metrics": self.get("metrics"),
        }
        if "eval_subset_size" in self.values:
            kwargs["eval_subset_size"] = self.values["eval_subset_size"]
        if "eval_fn" in self.values:
            kwargs["eval_fn"] = self._entry_point("eval_fn", self.values["eval_fn"])
        else:
            kwargs["eval_data"] = self._eval_data()
        return kwargs

    def study_kwargs(self, trials_load_method: str | None = None) -> dict[str, Any]:
        """Keyword arguments of :func:`optuna_quant.create_study`: model and data loaded.

        Args:
            trials_load_method: Overrides the file's ``trials_load_method``.

        Raises:
            ConfigError: For a missing key, a missing file or an entry point that does not import.
        """
        method = trials_load_method or self.get("trials_load_method", "cold_start")
        # create_study adds the fine-tune suffix itself; other methods act on the study as named.
        name = self.get("study_name", DEFAULT_STUDY_NAME) if method == "fine_tune" else self.study_name
        kwargs: dict[str, Any] = {key: self.values[key] for key in _STUDY_KEYS if key in self.values}
        kwargs.update(self.measure_kwargs(), storage=self.storage, study_name=name, trials_load_method=method)
        return kwargs

    def _model(self) -> Any:
        value = self.values["model"]
        return self._call("model", value) if _ENTRY_POINT.match(value) else value

    def _calibration_data(self) -> Any:
        value = self.values["calibration_data"]
        if _ENTRY_POINT.match(value):
            return self._call("calibration_data", value)
        arrays = self._arrays("calibration_data", value)
        if isinstance(arrays, np.ndarray):
            # Batch axis first: every sample becomes a batch of one.
            return [arrays[i : i + 1] for i in range(len(arrays))]
        n = len(next(iter(arrays.values())))
        return [{name: a[i : i + 1] for name, a in arrays.items()} for i in range(n)]

    def _eval_data(self) -> tuple[Any, Any]:
        value = self.values["eval_data"]
        if isinstance(value, list):
            inputs, labels = (self._arrays("eval_data", v, ".npy") for v in value)
            return inputs, labels
        if _ENTRY_POINT.match(value):
            data = self._call("eval_data", value)
            if not (isinstance(data, (tuple, list)) and len(data) == 2):
                raise self.error(f"eval_data: {value} must return (inputs, labels).")
            inputs, labels = data
            return inputs, labels
        arrays = self._arrays("eval_data", value, ".npz")
        if set(arrays) != {"inputs", "labels"}:
            raise self.error(
                f"eval_data: {value} must hold the arrays 'inputs' and 'labels', not {sorted(arrays)}."
            )
        return arrays["inputs"], arrays["labels"]

    def _arrays(self, key: str, value: str, suffix: str | None = None) -> Any:
        """The array of a ``.npy`` file, or the ``{name: array}`` of a ``.npz`` file."""
        path = Path(value)
        if path.suffix not in ((suffix,) if suffix else (".npy", ".npz")):
            raise self.error(f"{key}: {value} is not a {suffix or '.npy or .npz'} file nor an entry point.")
        if not path.is_file():
            raise self.error(f"{key}: file {value} does not exist.")
        if path.suffix == ".npy":
            return np.load(path)
        with np.load(path) as archive:
            return {name: archive[name] for name in archive.files}

    def _entry_point(self, key: str, value: str) -> Any:
        module_name, _, attr = value.partition(":")
        for folder in (str(Path.cwd()), str(self.folder)):
            if folder not in sys.path:
                sys.path.insert(0, folder)
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as err:
            raise self.error(f"{key}: cannot import module {module_name!r} of {value}: {err}") from err
        for part in attr.split("."):
            if not hasattr(target, part):
                raise self.error(f"{key}: module {module_name!r} has no {attr!r} ({value}).")
            target = getattr(target, part)
        if not callable(target):
            raise self.error(f"{key}: {value} is not callable.")
        return target

    def _call(self, key: str, value: str) -> Any:
        return self._entry_point(key, value)()


def load_config(path: str | Path) -> RunConfig:
    """Read and check a YAML or JSON config file.

    Raises:
        ConfigError: For a missing or unreadable file, an unknown key, a value of the wrong type or
            a misplaced option; the message names the file and the key.

    Example:
        >>> load_config("tune.yaml")   # doctest: +SKIP
        Traceback (most recent call last):
        ...
        ConfigError: tune.yaml: unknown key 'max_trial'; did you mean 'max_trials'?
    """
    path = Path(path)
    if not path.is_file():
        raise _error(path, "config file does not exist.")
    return parse_config(path.read_text(encoding="utf-8"), path)


def parse_config(text: str, path: str | Path) -> RunConfig:
    """Check the text of a config file named ``path`` as :func:`load_config` does; the file need
    not exist and nothing is read or written.

    ``path`` names the file in messages, chooses JSON (``.json``) or YAML, and is the folder that
    relative paths resolve against. Files the config names are checked later, when they are used.

    Raises:
        ConfigError: For text that is not a mapping, an unknown key or a value of the wrong type.

    Example:
        >>> parse_config("{max_trials: 40, sampler: gp}", "tune.yaml").get("max_trials")
        40
        >>> parse_config("max_trial: 40", "tune.yaml")
        Traceback (most recent call last):
        ...
        optuna_quant.cli.config.ConfigError: tune.yaml: unknown key 'max_trial'; did you mean 'max_trials'?
    """
    path = Path(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise _error(path, f"not valid {kind}: {' '.join(str(err).split())}") from err
    if not isinstance(data, dict):
        raise _error(path, f"the file must hold a mapping of options, not {type(data).__name__}.")
    for key, value in data.items():
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(KEYS)}."
            raise _error(path, f"unknown key {key!r}{hint}")
        check, expected = KEYS[key]
        if not check(value):
            raise _error(path, f"{key!r} must be {expected}, got {value!r} ({type(value).__name__}).")
    return RunConfig(path, _normalised(path, data))


def _error(path: Path, message: str) -> ConfigError:
    return ConfigError(f"{path}: {message}")


def _normalised(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    folder = path.resolve().parent
    values = dict(data)
    for key in ("model", "calibration_data", "eval_data", "export", "artifact_dir"):
        value = values.get(key)
        if isinstance(value, list):
            values[key] = [_resolve_path(v, folder) for v in value]
        elif isinstance(value, str) and not (key != "export" and _ENTRY_POINT.match(value)):
            values[key] = _resolve_path(value, folder)
    if "storage" in values:
        values["storage"] = _resolve_storage(values["storage"], folder)
    if "metrics" in values:
        values["metrics"] = _baseline(path, values["metrics"])
    if "benchmark" in values:
        try:
            values["benchmark"] = BenchmarkSettings.from_dict(values["benchmark"])
        except (TypeError, ValueError) as err:
            raise _error(path, f"benchmark: {err}") from err
    return values


def _baseline(path: Path, metrics: Any) -> float:
    """POT's ``metrics``: a number, or the ``baseline_value`` of the first ``{name, baseline_value}``."""
    if _number(metrics):
        return float(metrics)
    first = metrics[0]
    if not _number(first.get("baseline_value")):
        raise _error(path, f"metrics[0] must have a numeric 'baseline_value', got {dict(first)!r}.")
    return float(first["baseline_value"])


def _resolve_path(value: str, folder: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def _resolve_storage(url: str, folder: Path) -> str:
    """An SQLite URL of a relative file made absolute against ``folder``; other URLs unchanged."""
    file = sqlite_file(url)
    if file is None or file.is_absolute():
        return url
    return make_url(url).set(database=_resolve_path(str(file), folder)).render_as_string(hide_password=False)
