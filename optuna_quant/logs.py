"""Logging of optuna-quant, after :mod:`optuna.logging`: one package handler, quiet by default.

The package logger ``optuna_quant`` has its own handler and does not propagate to the root logger,
so every line prints once whatever the application's logging set-up: onnxruntime's quantizer logs
with the module-level ``logging.warning``, whose first call gives the root logger a handler
(``logging.basicConfig``), and a propagating package logger would then print each line twice.
An application that routes every record through its own root handlers calls
:func:`enable_propagation` and :func:`disable_default_handler`, as with Optuna.

onnxruntime's quantizer warns once per node ("Expected bias ... to be an initializer" and the
like): :func:`quiet_onnxruntime` counts those records and logs one line instead, unless the
package logger is at ``DEBUG`` (``optuna-quant --verbose``).

Optuna's own lines per trial (finished, failed) list every parameter, one per layer:
:func:`compact_trial_lines` sums the layers up in them (``'layer': '48 layers: 45 int8, 3 fp32 (...)'``), so that it stays
readable on a model of many layers.

Example:
    >>> import logging
    >>> from optuna_quant import logs
    >>> logs.set_verbosity(logging.WARNING)          # doctest: +SKIP
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)   # doctest: +SKIP

The first line hides POT's per-trial lines, the second Optuna's "Trial ... finished" lines.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
import logging
import os
import re
import sys
import threading
from typing import Any

import onnxruntime
from tqdm import tqdm


_LIBRARY = "optuna_quant"
_FORMAT = "%(levelname)s:%(name)s:%(message)s"
_ONNXRUNTIME_DIR = os.path.dirname(onnxruntime.__file__) + os.sep
_lock = threading.Lock()
_default_handler: logging.Handler | None = None


class _ProgressAwareHandler(logging.Handler):
    """Writes to the current ``sys.stderr`` through ``tqdm.write``, above any progress bar.

    ``tqdm.write`` clears a bar on the way, writes the line and draws the bar again, so log lines
    and the bar never share a line. ``sys.stderr`` is looked up at each record, which follows a
    redirected stream (and pytest's capture).
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - a handler must not raise (logging's own convention)
            self.handleError(record)


def _library_logger() -> logging.Logger:
    return logging.getLogger(_LIBRARY)


def configure() -> None:
    """Give the package logger its handler (stderr, above progress bars) and stop propagation.

    Idempotent; :func:`optuna_quant.create_study` and the command line call it. The level is set
    to ``INFO`` (POT's log lines) unless the application set one.
    """
    global _default_handler
    with _lock:
        if _default_handler is not None:
            return
        _default_handler = _ProgressAwareHandler()
        _default_handler.setFormatter(logging.Formatter(_FORMAT))
        logger = _library_logger()
        logger.addHandler(_default_handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        logger.propagate = False


def get_verbosity() -> int:
    """The level of the package logger (``logging.INFO`` by default)."""
    configure()
    return _library_logger().getEffectiveLevel()


def set_verbosity(level: int) -> None:
    """Set the level of the package logger: ``logging.WARNING`` hides POT's per-trial lines,
    ``logging.DEBUG`` also shows onnxruntime's quantization warnings."""
    configure()
    _library_logger().setLevel(level)


def disable_default_handler() -> None:
    """Remove the package handler (the application's handlers, if propagating, still print)."""
    configure()
    assert _default_handler is not None
    _library_logger().removeHandler(_default_handler)


def enable_default_handler() -> None:
    """Add the package handler back."""
    configure()
    assert _default_handler is not None
    _library_logger().addHandler(_default_handler)


def disable_propagation() -> None:
    """Stop package records from reaching the root logger's handlers (the default)."""
    configure()
    _library_logger().propagate = False


def enable_propagation() -> None:
    """Pass package records on to the root logger's handlers too (pytest's caplog, say).

    Call :func:`disable_default_handler` as well, or each line prints twice.
    """
    configure()
    _library_logger().propagate = True


@dataclass
class QuantizationWarnings:
    """onnxruntime's quantization warnings held back by :func:`quiet_onnxruntime`.

    Attributes:
        count: How many warnings (``WARNING`` and above) onnxruntime logged.
        example: The first one's message.
        hint: What shows them, for the summary line.
    """

    count: int = 0
    example: str | None = None
    hint: str = "optuna_quant.logs.set_verbosity(logging.DEBUG) shows them"
    _shown: bool = field(default=False, repr=False)

    def summary(self) -> str | None:
        """The one line that replaces the warnings, or ``None`` when there were none."""
        if not self.count:
            return None
        plural = "" if self.count == 1 else "s"
        return (
            f"onnxruntime printed {self.count} quantization warning{plural} "
            f"(e.g. {self.example}); {self.hint}."
        )


class _OnnxruntimeFilter(logging.Filter):
    """On the root logger: holds back and counts the records onnxruntime logs there."""

    def __init__(self, warnings: QuantizationWarnings) -> None:
        super().__init__()
        self.warnings = warnings

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.startswith(_ONNXRUNTIME_DIR):
            return True
        if record.levelno >= logging.WARNING:
            if self.warnings.example is None:
                self.warnings.example = record.getMessage()
            self.warnings.count += 1
        return False


class _StandIn(logging.Handler):
    """The handler ``logging.basicConfig`` would add (stderr, level WARNING), present only while
    onnxruntime is quieted, so that its ``logging.warning`` finds a handler and configures none."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter(logging.BASIC_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - a handler must not raise (logging's own convention)
            self.handleError(record)


@contextmanager
def quiet_onnxruntime(hint: str | None = None) -> Iterator[QuantizationWarnings]:
    """Hold back onnxruntime's quantization log records and log one summary line at the end.

    Nothing is held back while the package logger is at ``DEBUG``. The root logger gets no
    handler from onnxruntime meanwhile (its ``logging.warning`` would call ``basicConfig``).
    Wrap it around a whole run, not each model: nested uses count in the outermost one.

    Args:
        hint: What shows the warnings, for the summary (the command line says ``--verbose``).

    Example:
        >>> with quiet_onnxruntime() as held:                 # doctest: +SKIP
        ...     quantizer.quantize(config)
        >>> held.count                                        # doctest: +SKIP
        12
    """
    held = QuantizationWarnings() if hint is None else QuantizationWarnings(hint=hint)
    if _library_logger().isEnabledFor(logging.DEBUG):
        yield held
        return
    root = logging.getLogger()
    stand_in = None if root.handlers else _StandIn()
    quiet = _OnnxruntimeFilter(held)
    root.addFilter(quiet)
    if stand_in is not None:
        root.addHandler(stand_in)
    try:
        yield held
    finally:
        root.removeFilter(quiet)
        if stand_in is not None:
            root.removeHandler(stand_in)
        line = held.summary()
        if line is not None:
            _library_logger().warning(line)


_NAMED = 6
"""Layers named at most per value in a summed-up trial line."""
_TRIAL_LINE = re.compile(r"Trial \d+ (finished with values?: .+? and|failed with) parameters: (?=\{)", re.S)
"""The start of Optuna's lines of a finished and of a failed trial, up to their parameters."""


def sum_up_layers(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``params`` with those named ``prefix<layer>`` summed up in one entry, ``prefix`` without its
    colon: how many layers take each value, most first, and the layers of the other values by name.

    Example:
        >>> sum_up_layers({"layer:a": "int8", "layer:b": "fp32", "layer:c": "int8", "approach": "dynamic"}, "layer:")
        {'approach': 'dynamic', 'layer': '3 layers: 2 int8, 1 fp32 (b)'}
    """
    layers = {name.removeprefix(prefix): value for name, value in params.items() if name.startswith(prefix)}
    if not layers:
        return dict(params)
    counts = Counter(layers.values()).most_common()
    parts = [f"{counts[0][1]} {counts[0][0]}"]
    for value, count in counts[1:]:
        names = [name for name, v in layers.items() if v == value]
        shown = ", ".join(names[:_NAMED]) + (", ..." if count > _NAMED else "")
        parts.append(f"{count} {value} ({shown})")
    rest = {name: value for name, value in params.items() if not name.startswith(prefix)}
    return {**rest, prefix.rstrip(":"): f"{len(layers)} layers: {', '.join(parts)}"}


def _parsed_params(text: str) -> tuple[dict[str, Any], int] | None:
    """The parameters' dict that ``text`` starts with, as Optuna writes it (its repr), and where
    it ends; ``None`` when no prefix of ``text`` is one (a value without a literal repr: nan)."""
    end = text.find("}")
    while end != -1:
        try:
            params = ast.literal_eval(text[: end + 1])
        except (ValueError, SyntaxError):
            end = text.find("}", end + 1)
            continue
        return (params, end + 1) if isinstance(params, dict) else None
    return None


class _TrialLineFilter(logging.Filter):
    """On Optuna's loggers: sums up the layers among the parameters of its lines per trial."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        head = _TRIAL_LINE.match(message)
        parsed = None if head is None else _parsed_params(message[head.end() :])
        if parsed is not None:
            params, end = parsed
            summed = repr(sum_up_layers(params, self.prefix))
            record.msg, record.args = message[: head.end()] + summed + message[head.end() + end :], ()
        return True


def compact_trial_lines(loggers: Iterable[logging.Logger], prefix: str) -> None:
    """Have ``loggers`` (Optuna's) sum up the parameters named ``prefix<layer>`` in their lines of a
    finished or failed trial (:func:`sum_up_layers`). Idempotent."""
    with _lock:
        for logger in loggers:
            if not any(isinstance(f, _TrialLineFilter) for f in logger.filters):
                logger.addFilter(_TrialLineFilter(prefix))


@contextmanager
def restored() -> Iterator[None]:
    """Put the package logger's and Optuna's logging back as they were on exit.

    For an entry point called in-process (tests call ``optuna_quant.cli.commands``): what it sets
    for its run does not leak into the caller.
    """
    import optuna

    global _default_handler
    logger = _library_logger()
    state = (list(logger.handlers), logger.level, logger.propagate, optuna.logging.get_verbosity())
    handler = _default_handler
    try:
        yield
    finally:
        _default_handler = handler
        logger.handlers[:] = state[0]
        logger.setLevel(state[1])
        logger.propagate = state[2]
        optuna.logging.set_verbosity(state[3])
