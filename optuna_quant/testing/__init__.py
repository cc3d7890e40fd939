"""Helpers for testing and benchmarking optuna-quant, as ``optuna.testing`` is for Optuna.

They are no part of the tuning API and may change without notice.
"""
