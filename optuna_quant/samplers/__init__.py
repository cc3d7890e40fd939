"""Samplers of optuna-quant: plain Optuna samplers, usable on any study."""

from __future__ import annotations
