"""The versions a benchmark ran with, recorded beside its results."""

from __future__ import annotations

from importlib import metadata
import platform


PACKAGES = ("optuna", "numpy", "scipy", "onnx", "onnxruntime", "torch", "hyperopt", "nncf", "onnx-neural-compressor", "olive-ai")


def versions() -> dict[str, str | None]:
    """Python's version and each of :data:`PACKAGES`' (``None`` where one is not installed).

    Example:
        >>> versions()["python"] == platform.python_version()
        True
    """
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found
