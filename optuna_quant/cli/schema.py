"""The keys of a config file and what each value must be; :class:`ConfigError` for any misuse.

Example:
    >>> check_keys(Path("tune.yaml"), {"max_trials": 40, "sampler": "gp"})
    >>> check_keys(Path("tune.yaml"), {"max_trials": 0})
    Traceback (most recent call last):
    ...
    optuna_quant.cli.schema.ConfigError: tune.yaml: 'max_trials' must be a positive integer, got 0 (int).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
import difflib
from pathlib import Path
import re
from typing import Any

from optuna_quant.quantization.groups import GROUPINGS
from optuna_quant.study.load_methods import TRIALS_LOAD_METHODS
from optuna_quant.trial.objective import OBJECTIVE_MODES


ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
"""A Python entry point, ``module:function``."""


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""


def config_error(path: Path, message: str) -> ConfigError:
    """A :class:`ConfigError` whose message starts with the config file ``path``."""
    return ConfigError(f"{path}: {message}")


def number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_integer(value: Any) -> bool:
    return _integer(value) and value > 0


def _positive(value: Any) -> bool:
    return number(value) and value > 0


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _metrics(value: Any) -> bool:
    return number(value) or (isinstance(value, list) and bool(value) and isinstance(value[0], Mapping))


def _eval_data(value: Any) -> bool:
    return isinstance(value, str) or (_strings(value) and len(value) == 2)


# Each key with the check of its value and what the check expects, for the error message.
KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "max_trials": (_positive_integer, "a positive integer"),
    "max_minutes": (_positive, "a positive number"),
    "trials_load_method": (lambda v: v in TRIALS_LOAD_METHODS, f"one of {', '.join(TRIALS_LOAD_METHODS)}"),
    "accuracy_loss": (number, "a number (percent)"),
    "latency_reduce": (number, "a number"),
    "accuracy_weight": (number, "a number"),
    "latency_weight": (number, "a number"),
    "stop_on_target": (lambda v: isinstance(v, bool), "true or false"),
    "eval_subset_size": (_positive_integer, "a positive integer"),
    "metrics": (_metrics, "a number or a list of {name, baseline_value}"),
    "benchmark": (lambda v: isinstance(v, Mapping), "a mapping of benchmark settings"),
    "model": (_string, "a file path or an entry point module:function"),
    "calibration_data": (_string, "a .npy/.npz file or an entry point module:function"),
    "eval_data": (_eval_data, "a .npz file, two .npy files or an entry point module:function"),
    "latency_data": (_string, "a .npy/.npz file or an entry point module:function"),
    "eval_fn": (lambda v: _string(v) and bool(ENTRY_POINT.match(v)), "an entry point module:function"),
    "sampler": (_string, "a sampler name (tpe, gp, random)"),
    "seed": (_integer, "an integer"),
    "storage": (_string, "an Optuna storage URL"),
    "study_name": (_string, "a string"),
    "scopes": (_strings, "a list of scope names"),
    "nodes": (_strings, "a list of node names"),
    "layer_groups": (lambda v: v in GROUPINGS, f"one of {', '.join(GROUPINGS)}"),
    "export": (_string, "a file path"),
    "objective_mode": (lambda v: v in OBJECTIVE_MODES, f"one of {', '.join(OBJECTIVE_MODES)}"),
    "artifact_dir": (_string, "a folder path"),
    "pre_process": (lambda v: isinstance(v, bool) or v == "transformer", "true, false or transformer"),
    "sensitivity": (lambda v: isinstance(v, bool) or v == "full", "true, false or full"),
    "recipes": (lambda v: isinstance(v, bool), "true or false"),
    "pruning": (lambda v: isinstance(v, bool), "true or false"),
}
STUDY_KEYS = (
    "accuracy_loss", "latency_reduce", "accuracy_weight", "latency_weight", "stop_on_target",
    "sampler", "seed", "scopes", "nodes", "layer_groups", "objective_mode", "artifact_dir", "pre_process", "sensitivity",
    "recipes", "pruning",
)
"""The keys passed to ``create_study`` unchanged when given."""


def check_keys(path: Path, data: Mapping[Any, Any]) -> None:
    """Check that every key of the config file ``path`` is known and its value of the right type.

    Raises:
        ConfigError: For an unknown key, naming the closest known one, or a value of the wrong type.
    """
    for key, value in data.items():
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(KEYS)}."
            raise config_error(path, f"unknown key {key!r}{hint}")
        check, expected = KEYS[key]
        if not check(value):
            raise config_error(path, f"{key!r} must be {expected}, got {value!r} ({type(value).__name__}).")
