"""The run configuration file of ``optuna-quant``: POT's option names plus the model, data and study.

A config file is YAML (or JSON, for a ``.json`` file) holding one mapping. Every key is checked
before any long work starts (:mod:`.schema`): an unknown key is an error that names it, the file
and the closest known key; a value of the wrong type names its key. Relative paths (and the file
of a ``sqlite:///`` or ``journal:`` storage) resolve against the config file's folder, so a run
does not depend on the directory it is started from.

``model``, ``calibration_data`` and ``eval_data`` are files or Python entry points
``module:function``, and ``eval_fn`` names the evaluation function itself; :mod:`.loaders` loads
them when a command needs them.

Example:
    >>> cfg = load_config("examples/demo_config.yaml")   # doctest: +SKIP
    >>> cfg.max_trials, cfg.study_name                   # doctest: +SKIP
    (40, 'mnist-cnn-int8')
    >>> study = create_study(**cfg.study_kwargs())       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
import inspect
import json
from pathlib import Path
from typing import Any

from optuna.storages import BaseStorage
from sqlalchemy.engine import make_url
import yaml

from optuna_quant.cli.loaders import load_calibration_data
from optuna_quant.cli.loaders import load_entry_point
from optuna_quant.cli.loaders import load_eval_data
from optuna_quant.cli.loaders import load_latency_data
from optuna_quant.cli.loaders import load_model
from optuna_quant.cli.schema import check_keys
from optuna_quant.cli.schema import config_error
from optuna_quant.cli.schema import ConfigError
from optuna_quant.cli.schema import ENTRY_POINT
from optuna_quant.cli.schema import number
from optuna_quant.cli.schema import STUDY_KEYS
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import NotWritableError
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import DEFAULT_STORAGE
from optuna_quant.storages.urls import journal_file
from optuna_quant.storages.urls import JOURNAL_SCHEME
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.study import create_study
from optuna_quant.study.load_methods import FINE_TUNE_SUFFIX


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
        return config_error(self.path, message)

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
            "model": load_model(self.values["model"], self.path),
            "calibration_data": load_calibration_data(self.values["calibration_data"], self.path),
            "benchmark": self.get("benchmark"),
            "metrics": self.get("metrics"),
        }
        if "eval_subset_size" in self.values:
            kwargs["eval_subset_size"] = self.values["eval_subset_size"]
        if "latency_data" in self.values:
            kwargs["latency_data"] = load_latency_data(self.values["latency_data"], self.path)
        if "eval_fn" in self.values:
            kwargs["eval_fn"] = load_entry_point("eval_fn", self.values["eval_fn"], self.path)
        else:
            kwargs["eval_data"] = load_eval_data(self.values["eval_data"], self.path)
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
        kwargs: dict[str, Any] = {key: self.values[key] for key in STUDY_KEYS if key in self.values}
        kwargs.update(self.measure_kwargs(), storage=self.storage, study_name=name, trials_load_method=method)
        return kwargs


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
        raise config_error(path, "config file does not exist.")
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
        optuna_quant.cli.schema.ConfigError: tune.yaml: unknown key 'max_trial'; did you mean 'max_trials'?
    """
    path = Path(path)
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        kind = "JSON" if path.suffix == ".json" else "YAML"
        raise config_error(path, f"not valid {kind}: {' '.join(str(err).split())}") from err
    if not isinstance(data, dict):
        raise config_error(path, f"the file must hold a mapping of options, not {type(data).__name__}.")
    check_keys(path, data)
    return RunConfig(path, _normalised(path, data))


def _normalised(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    folder = path.resolve().parent
    values = dict(data)
    for key in ("model", "calibration_data", "eval_data", "latency_data", "export", "artifact_dir"):
        value = values.get(key)
        if isinstance(value, list):
            values[key] = [_resolve_path(v, folder) for v in value]
        elif isinstance(value, str) and not (key != "export" and ENTRY_POINT.match(value)):
            values[key] = _resolve_path(value, folder)
    if "storage" in values:
        values["storage"] = _resolve_storage(values["storage"], folder)
    if "metrics" in values:
        values["metrics"] = _baseline(path, values["metrics"])
    if "benchmark" in values:
        try:
            values["benchmark"] = BenchmarkSettings.from_dict(values["benchmark"])
        except (TypeError, ValueError) as err:
            raise config_error(path, f"benchmark: {err}") from err
    return values


def _baseline(path: Path, metrics: Any) -> float:
    """POT's ``metrics``: a number, or the ``baseline_value`` of the first ``{name, baseline_value}``."""
    if number(metrics):
        return float(metrics)
    first = metrics[0]
    if not number(first.get("baseline_value")):
        raise config_error(path, f"metrics[0] must have a numeric 'baseline_value', got {dict(first)!r}.")
    return float(first["baseline_value"])


def _resolve_path(value: str, folder: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (folder / path).resolve())


def _resolve_storage(url: str, folder: Path) -> str:
    """An SQLite or journal URL of a relative file made absolute against ``folder``; other URLs unchanged."""
    journal = journal_file(url)
    if journal is not None:
        return f"{JOURNAL_SCHEME}{_resolve_path(str(journal), folder)}"
    file = sqlite_file(url)
    if file is None or file.is_absolute():
        return url
    return make_url(url).set(database=_resolve_path(str(file), folder)).render_as_string(hide_password=False)
