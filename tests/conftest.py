"""Fixtures: the tiny random-weight CNN of :mod:`examples.tiny_cnn` and its data, fast latency settings;
the tiny BERT of :mod:`examples.bert` (exported once, cached under ``.cache/bert``) and its data.

``make_study`` creates a study of that CNN in tmp_path; ``write_project`` writes a CLI project
and ``load_project_study`` reads its study back; ``tuned`` is the config of a CLI project whose
study the CLI has run. ``postgres_url`` is a throwaway PostgreSQL database
(:mod:`optuna_quant.testing.postgres`), ``mariadb_url`` one of a throwaway MariaDB server
(:mod:`optuna_quant.testing.mariadb`), ``grpc_url`` Optuna's gRPC proxy in front of a throwaway
PostgreSQL database of its own (:mod:`optuna_quant.testing.grpc_proxy`). ``subprocess_env`` is the environment of the processes the
tests start; ``assert_int8_layers`` checks which layers of an int8 model are quantized.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import optuna
import pytest
import yaml

from examples.bert import EmbeddingAgreement
from examples.bert import tiny_bert
from examples.bert import token_feeds
from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
from examples.tiny_cnn import fp32_agreement
import optuna_quant as oq
from optuna_quant import logs
from optuna_quant.cli import main
from optuna_quant.measure.evaluate import Top1Accuracy
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.testing import mariadb
from optuna_quant.testing.grpc_proxy import grpc_proxy
from optuna_quant.testing.postgres import NO_BINARIES
from optuna_quant.testing.postgres import pg_bindir
from optuna_quant.testing.postgres import postgres_server


ROOT = Path(__file__).resolve().parent.parent
"""The repository root."""

FAST_BENCH = BenchmarkSettings(warmup=2, blocks=3, min_seconds=0.03)
"""Latency settings that keep each measurement short; the CLI configs get them as a mapping."""

CNN_LAYERS = ("conv1", "conv2", "fc")
"""The tunable nodes of :func:`examples.tiny_cnn.build_cnn`'s model."""


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a process a test starts: this one's, with OpenBLAS on one thread, plus ``extra``.

    One BLAS thread per process keeps several workers (and pytest itself) from oversubscribing
    the few cores of a test machine.
    """
    # The repository root on the path: a child imports this checkout's package and examples
    # wherever it runs, as the tests do (pytest's pythonpath).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


@pytest.fixture(autouse=True)
def _package_logs_reach_caplog() -> Iterator[None]:
    """The package logger propagates during a test, so ``caplog`` sees its lines; put back after."""
    with logs.restored():
        logs.enable_propagation()
        yield


def assert_int8_layers(
    model: onnx.ModelProto, params: Mapping[str, Any], layers: Iterable[str] = CNN_LAYERS
) -> None:
    """Assert that ``model`` is the int8 model of ``params``: each of ``layers`` is a node of it,
    whose weight comes from a DequantizeLinear exactly when ``params`` does not keep it in fp32
    (``"layer:<name>": "fp32"``)."""
    layers = tuple(layers)
    tuned = {key.removeprefix("layer:") for key in params if key.startswith("layer:")}
    assert tuned <= set(layers), f"params name layers that are not checked: {tuned - set(layers)}"
    fallback = {name for name in layers if params.get(f"layer:{name}") == "fp32"}
    produced_by = {output: n.op_type for n in model.graph.node for output in n.output}
    nodes = {n.name: n for n in model.graph.node if n.name in layers}
    assert set(nodes) == set(layers), f"layers missing from the model: {set(layers) - set(nodes)}"
    for name, node in nodes.items():  # int8 weights come from a DequantizeLinear, fp32 ones do not
        quantized = produced_by.get(node.input[1]) == "DequantizeLinear"
        assert quantized == (name not in fallback), (
            f"{name}: weight {'quantized' if quantized else 'fp32'}, params keep it in "
            f"{'fp32' if name in fallback else 'int8'}"
        )


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
def bert_path() -> Path:
    """A two-layer BERT with random weights, exported as ``torch.onnx.export`` gives it: opset 17,
    dynamic batch and sequence, an attention mask filled with ``finfo.min``."""
    return tiny_bert()


@pytest.fixture(scope="session")
def bert_feeds() -> list[dict[str, np.ndarray]]:
    """Eight feeds of two padded token sequences each."""
    return token_feeds(8, seed=0)


@pytest.fixture(scope="session")
def bert_agreement(bert_path: Path) -> EmbeddingAgreement:
    """Agreement with the fp32 sentence embeddings of other token sequences: fp32 scores 1."""
    return EmbeddingAgreement(bert_path, token_feeds(8, seed=1))


@pytest.fixture(scope="session")
def fast_bench() -> BenchmarkSettings:
    return FAST_BENCH


@pytest.fixture
def make_study(
    tmp_path: Path, cnn_path: Path, calib: list[np.ndarray], agreement: Top1Accuracy, fast_bench: BenchmarkSettings
) -> Callable[..., oq.QuantStudy]:
    """``make_study(model=cnn_path, eval_fn=agreement, **kwargs)``: :func:`optuna_quant.create_study`.

    A random sampler with seed 0, the SQLite storage ``tmp_path/study.db`` and ``fast_bench`` unless
    ``kwargs`` says otherwise; every call of one test opens the same storage.
    """

    def make(model: Any = None, eval_fn: Any = None, **kwargs: Any) -> oq.QuantStudy:
        kwargs.setdefault("sampler", "random")
        kwargs.setdefault("seed", 0)
        kwargs.setdefault("storage", f"sqlite:///{tmp_path}/study.db")
        kwargs.setdefault("benchmark", fast_bench)
        return oq.create_study(
            cnn_path if model is None else model, calib, agreement if eval_fn is None else eval_fn, **kwargs
        )

    return make


def write_project(
    folder: Path, cnn: onnx.ModelProto, calib: list[np.ndarray], agreement: Top1Accuracy, **options: Any
) -> Path:
    """Write the tiny CNN, its data and a config with relative paths into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(cnn, str(folder / "tiny_cnn.onnx"))
    np.save(folder / "calib.npy", np.concatenate(calib))
    np.savez(folder / "eval.npz", inputs=agreement.inputs, labels=agreement.labels)
    config = {
        "model": "tiny_cnn.onnx",
        "calibration_data": "calib.npy",
        "eval_data": "eval.npz",
        "max_trials": 3,
        "accuracy_loss": 50.0,
        "sampler": "random",
        "seed": 0,
        "storage": "sqlite:///study.db",
        "study_name": "cli",
        "benchmark": dataclasses.asdict(FAST_BENCH),
        **options,
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def load_project_study(folder: Path, name: str = "cli") -> optuna.Study:
    """Study ``name`` of the project that :func:`write_project` wrote into ``folder`` (its
    ``study.db``), as the CLI stored it."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///{folder}/study.db")


@pytest.fixture(scope="module")
def tuned(
    tmp_path_factory: pytest.TempPathFactory, cnn: onnx.ModelProto, calib: list[np.ndarray], agreement: Top1Accuracy
) -> Path:
    """The config of a project whose study 'cli' holds three finished trials, run by the CLI,
    with its whole sensitivity (``sensitivity: full``: three trials' share of the time would buy none).

    Module-scoped, not session-scoped, on purpose: every module gets its own project. test_cli
    adds a fine-tune study and files beside the config, while test_dashboard expects the storage
    to hold study 'cli' alone.
    """
    config = write_project(tmp_path_factory.mktemp("tuned"), cnn, calib, agreement, sensitivity="full")
    assert main(["tune", str(config)]) == 0
    return config


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """The URL of a fresh PostgreSQL database, removed with its server after the module."""
    if pg_bindir() is None:
        pytest.skip(NO_BINARIES)
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="module")
def mariadb_url() -> Iterator[str]:
    """The URL of a fresh MariaDB database, removed with its server after the module."""
    if mariadb.server_binaries() is None:
        pytest.skip(mariadb.NO_BINARIES)
    with mariadb.mariadb_server() as url:
        yield url


@pytest.fixture(scope="module")
def grpc_url() -> Iterator[str]:
    """``grpc://`` URL of Optuna's gRPC proxy in front of a fresh PostgreSQL database of its own."""
    if pg_bindir() is None:
        pytest.skip(NO_BINARIES)
    with postgres_server() as url, grpc_proxy(url) as proxy:
        yield proxy


@pytest.fixture(params=["sqlite", "postgresql", "mariadb", "journal", "grpc"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of each storage that workers share, for one test each (its servers: the module's)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/study.db"
    if request.param == "journal":
        return f"journal:{tmp_path}/study.log"
    return request.getfixturevalue({"postgresql": "postgres_url", "mariadb": "mariadb_url", "grpc": "grpc_url"}[request.param])
