"""The ``optuna-quant`` command: ``probe``, ``tune``, ``worker``, ``best``, ``dashboard``, ``report``."""

from __future__ import annotations

from optuna_quant.cli.commands import main


__all__ = ["main"]
