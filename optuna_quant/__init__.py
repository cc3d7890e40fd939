"""optuna-quant: tune post-training int8 quantization with Optuna."""

from __future__ import annotations
