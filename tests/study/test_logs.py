"""Quiet by default: each line once whatever the logging set-up, onnxruntime's warnings summarised.

The model is the tiny CNN with its convolution biases moved into Constant nodes, on which
onnxruntime's real quantizer logs "Expected bias ... to be an initializer" through the root
logger for every convolution it quantizes.
"""

from __future__ import annotations

from collections import Counter
import logging
from pathlib import Path
import subprocess
import sys
import textwrap

from conftest import subprocess_env
import onnx
from onnx import helper
import pytest

from examples.tiny_cnn import build_cnn
from examples.tiny_cnn import calibration_data
from optuna_quant import logs
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.trial.space import SearchSpace


def biases_in_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every Conv bias given by a Constant node instead of an initializer."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    biases = {n.input[2] for n in model.graph.node if n.op_type == "Conv" and len(n.input) > 2}
    for init in [i for i in model.graph.initializer if i.name in biases]:
        model.graph.initializer.remove(init)
        model.graph.node.insert(0, helper.make_node("Constant", [], [init.name], value=init))
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def warning_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("warn") / "bias_constants.onnx"
    onnx.save(biases_in_constants(build_cnn()), str(path))
    return path


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=subprocess_env(),
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


def _repeated(text: str) -> list[str]:
    """Lines printed more than once in a row (a doubled handler prints each line twice in a row)."""
    lines = text.splitlines()
    return [a for a, b in zip(lines, lines[1:]) if a == b]


def test_quantizer_warnings_become_one_line_and_each_line_prints_once(warning_model, tmp_path) -> None:
    done = _python(
        f"""
        import logging, onnx
        from examples.tiny_cnn import calibration_data
        from optuna_quant import logs
        from optuna_quant.quantization.model_io import to_feeds
        from optuna_quant.quantization.quantize import Quantizer
        from optuna_quant.trial.space import SearchSpace
        model = onnx.load({str(warning_model)!r})
        logs.configure()
        quantizer = Quantizer(model.SerializeToString(), to_feeds(calibration_data(model, n=4), model))
        space = SearchSpace.from_model(model)
        config = space.to_config(space.default_params())
        with logs.quiet_onnxruntime() as held:
            for i in range(3):
                quantizer.quantize(config)
                logging.getLogger("optuna_quant").info("line %d", i)
        assert not logging.getLogger().handlers, logging.getLogger().handlers  # no basicConfig
        logging.basicConfig()  # the application's own set-up, after the fact
        logging.getLogger("optuna_quant").info("still one line")
        print(held.count)
        """,
        tmp_path,
    )
    assert "Expected bias" not in done.stderr.replace("(e.g. Expected bias", "")
    lines = Counter(done.stderr.splitlines())
    assert [lines[f"INFO:optuna_quant:line {i}"] for i in range(3)] == [1, 1, 1]
    assert _repeated(done.stderr) == []
    assert done.stderr.count("INFO:optuna_quant:still one line") == 1
    count = int(done.stdout)
    assert count == 6  # two convolutions with a constant bias, three models
    summaries = [line for line in done.stderr.splitlines() if "quantization warning" in line]
    assert summaries == [
        "WARNING:optuna_quant:onnxruntime printed 6 quantization warnings "
        "(e.g. Expected bias 'b1' to be an initializer); "
        "optuna_quant.logs.set_verbosity(logging.DEBUG) shows them."
    ]


def test_debug_level_lets_the_warnings_through(warning_model) -> None:
    model = onnx.load(str(warning_model))
    quantizer = Quantizer(model.SerializeToString(), to_feeds(calibration_data(model, n=4), model))
    space = SearchSpace.from_model(model)
    root = logging.getLogger()
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    collect = Collect()
    root.addHandler(collect)
    try:
        with logs.restored():
            logs.set_verbosity(logging.DEBUG)
            with logs.quiet_onnxruntime() as held:
                quantizer.quantize(space.to_config(space.default_params()))
        assert held.count == 0 and held.summary() is None
        assert "Expected bias 'b1' to be an initializer" in seen
        seen.clear()
        with logs.quiet_onnxruntime() as held:
            quantizer.quantize(space.to_config(space.default_params()))
        assert held.count == 2 and not [m for m in seen if m.startswith("Expected bias")]
    finally:
        root.removeHandler(collect)


def test_propagation_switches_like_optunas(caplog) -> None:
    logger = logging.getLogger("optuna_quant")
    before = (list(logger.handlers), logger.propagate, logger.level)
    with logs.restored():
        logs.disable_propagation()  # configure()'s default; conftest turns it on for caplog
        assert logger.propagate is False
        logger.info("not for the root handlers")
        assert "not for the root handlers" not in caplog.text
        logs.enable_propagation()
        logs.disable_default_handler()
        logger.warning("through the root handlers")
        assert "through the root handlers" in caplog.text
        logs.disable_propagation()
        logs.enable_default_handler()
        assert logger.propagate is False and len(logger.handlers) == 1
    assert (list(logger.handlers), logger.propagate, logger.level) == before  # restored() put it back


def test_python_path_prints_each_line_once_without_the_flood(warning_model, tmp_path) -> None:
    """The README's Python path with no logging configured, on a model that makes onnxruntime warn."""
    done = _python(
        f"""
        import onnx
        import optuna_quant as oq
        from examples.tiny_cnn import calibration_data, fp32_agreement
        model = onnx.load({str(warning_model)!r})
        study = oq.create_study(model, calibration_data(model), fp32_agreement(model), sampler="random", seed=0,
                                storage="sqlite:///s.db", benchmark=dict(warmup=2, blocks=3, min_seconds=0.03),
                                pre_process=False)  # quant_pre_process would fold the warning biases away
        study.optimize(n_trials=3)
        """,
        tmp_path,
    )
    assert "INFO:optuna_quant:Trial iteration start: 2 / 3" in done.stderr
    assert _repeated(done.stderr) == []
    assert "WARNING:root:Expected bias" not in done.stderr
    assert done.stderr.count("quantization warnings") == 1


def test_optunas_line_per_trial_names_the_layers_in_one_entry(make_study, caplog) -> None:
    study = make_study()
    params = {**study.objective.space.default_params(), "layer:conv2": "fp32"}
    study.enqueue_trial(params)
    with caplog.at_level(logging.INFO, logger="optuna"):
        study.optimize(n_trials=2)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("optuna.") and " finished with value" in r.getMessage()]
    summed = {key: value for key, value in params.items() if not key.startswith("layer:")}
    summed["layer"] = "3 layers: 2 int8, 1 fp32 (conv2)"
    assert f"and parameters: {summed!r}." in lines[0]
    assert all("layer:" not in line for line in lines)
