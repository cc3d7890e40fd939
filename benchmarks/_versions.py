"""The versions a benchmark ran with and the CPU int8 class it ran on, recorded beside its results."""

from __future__ import annotations

from importlib import metadata
import platform

from optuna_quant.measure.cpu import int8_support


PACKAGES = ("optuna", "numpy", "scipy", "onnx", "onnxruntime", "torch", "hyperopt", "nncf", "onnx-neural-compressor", "olive-ai")


def versions() -> dict[str, str | None]:
    """Python's version, each of :data:`PACKAGES`' (``None`` where one is not installed), and the
    CPU's int8 class (``int8_class``): figures of one class do not hold on another.

    Example:
        >>> versions()["python"] == platform.python_version()
        True
    """
    found: dict[str, str | None] = {"python": platform.python_version(), "int8_class": int8_support().int8_class}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
