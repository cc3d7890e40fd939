"""The values a config file names, loaded: models and data from files or entry points.

An entry point ``module:function`` is imported with the config file's folder and the current
directory on ``sys.path``; a model or data entry point is called without arguments and returns the
value. Every error is a :class:`~optuna_quant.cli.schema.ConfigError` naming the config file
and the key.
"""

from __future__ import annotations

import importlib
from pathlib import Path
import sys
from typing import Any

import numpy as np

from optuna_quant.cli.schema import config_error
from optuna_quant.cli.schema import ENTRY_POINT


def load_model(value: str, config: Path) -> Any:
    """The ``model``: a file path, kept as is, or what the entry point ``value`` returns."""
    return _call("model", value, config) if ENTRY_POINT.match(value) else value


def load_calibration_data(value: str, config: Path) -> Any:
    """The ``calibration_data``: every sample of a ``.npy``/``.npz`` file as a batch of one, or
    what the entry point ``value`` returns."""
    if ENTRY_POINT.match(value):
        return _call("calibration_data", value, config)
    arrays = _arrays("calibration_data", value, config)
    if isinstance(arrays, np.ndarray):
        # Batch axis first: every sample becomes a batch of one.
        return [arrays[i : i + 1] for i in range(len(arrays))]
    n = len(next(iter(arrays.values())))
    return [{name: a[i : i + 1] for name, a in arrays.items()} for i in range(n)]


def load_latency_data(value: str, config: Path) -> Any:
    """The ``latency_data``: one input to time on, a ``.npy`` file (a single-input model) or a
    ``.npz`` file (one array per input, by name) as it is, or what the entry point ``value``
    returns."""
    return _call("latency_data", value, config) if ENTRY_POINT.match(value) else _arrays("latency_data", value, config)


def load_eval_data(value: str | list[str], config: Path) -> tuple[Any, Any]:
    """The ``eval_data`` ``(inputs, labels)``: two ``.npy`` files, one ``.npz`` file holding
    ``inputs`` and ``labels``, or what the entry point ``value`` returns."""
    if isinstance(value, list):
        inputs, labels = (_arrays("eval_data", v, config, ".npy") for v in value)
        return inputs, labels
    if ENTRY_POINT.match(value):
        data = _call("eval_data", value, config)
        if not (isinstance(data, (tuple, list)) and len(data) == 2):
            raise config_error(config, f"eval_data: {value} must return (inputs, labels).")
        inputs, labels = data
        return inputs, labels
    arrays = _arrays("eval_data", value, config, ".npz")
    if set(arrays) != {"inputs", "labels"}:
        raise config_error(
            config, f"eval_data: {value} must hold the arrays 'inputs' and 'labels', not {sorted(arrays)}."
        )
    return arrays["inputs"], arrays["labels"]


def load_entry_point(key: str, value: str, config: Path) -> Any:
    """The callable that the entry point ``value`` (``module:function``) of ``key`` names."""
    module_name, _, attr = value.partition(":")
    for folder in (str(Path.cwd()), str(config.resolve().parent)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise config_error(config, f"{key}: cannot import module {module_name!r} of {value}: {err}") from err
    for part in attr.split("."):
        if not hasattr(target, part):
            raise config_error(config, f"{key}: module {module_name!r} has no {attr!r} ({value}).")
        target = getattr(target, part)
    if not callable(target):
        raise config_error(config, f"{key}: {value} is not callable.")
    return target


def _call(key: str, value: str, config: Path) -> Any:
    return load_entry_point(key, value, config)()


def _arrays(key: str, value: str, config: Path, suffix: str | None = None) -> Any:
    """The array of a ``.npy`` file, or the ``{name: array}`` of a ``.npz`` file."""
    path = Path(value)
    if path.suffix not in ((suffix,) if suffix else (".npy", ".npz")):
        raise config_error(config, f"{key}: {value} is not a {suffix or '.npy or .npz'} file nor an entry point.")
    if not path.is_file():
        raise config_error(config, f"{key}: file {value} does not exist.")
    if path.suffix == ".npy":
        return np.load(path)
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}
