"""Fixtures: the tiny random-weight CNN of :mod:`examples.tiny_cnn` and its data, fast latency settings.

``postgres_url`` is a throwaway PostgreSQL database (:mod:`optuna_quant.testing.postgres`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
from examples.tiny_cnn import fp32_agreement
from optuna_quant.evaluate import Top1Accuracy
from optuna_quant.latency import BenchmarkSettings
from optuna_quant.testing.postgres import NO_BINARIES
from optuna_quant.testing.postgres import pg_bindir
from optuna_quant.testing.postgres import postgres_server


@pytest.fixture(scope="session")
def cnn() -> onnx.ModelProto:
    return build_cnn()


@pytest.fixture(scope="session")
def cnn_path(tmp_path_factory: pytest.TempPathFactory, cnn: onnx.ModelProto) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"
    onnx.save(cnn, str(path))
    return path


@pytest.fixture(scope="session")
def calib(cnn: onnx.ModelProto) -> list[np.ndarray]:
    return calibration_data(cnn)


@pytest.fixture(scope="session")
def agreement(cnn: onnx.ModelProto) -> Top1Accuracy:
    """Top-1 agreement with the fp32 model on 200 inputs: fp32 scores exactly 1."""
    return fp32_agreement(cnn)


@pytest.fixture(scope="session")
def fast_bench() -> BenchmarkSettings:
    return BenchmarkSettings(warmup=2, blocks=3, min_seconds=0.03)


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """The URL of a fresh PostgreSQL database, removed with its server after the module."""
    if pg_bindir() is None:
        pytest.skip(NO_BINARIES)
    with postgres_server() as url:
        yield url
