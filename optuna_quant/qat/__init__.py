"""Quantization-aware training helpers after pytorch_quantization."""

from __future__ import annotations
