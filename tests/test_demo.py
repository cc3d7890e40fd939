"""The demo's model gives the tuner real work, and `make demo`'s script runs end to end."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from examples import demo
from examples.demo_model import build_demo_model
from examples.mnist import load_mnist
import optuna_quant as oq

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_model() -> Path:
    # The cache is the demo's own (.cache/demo): a second run, and `make demo`, start at once.
    return build_demo_model()


def test_default_int8_misses_one_percent_and_a_fallback_recovers(demo_model, fast_bench) -> None:
    data = load_mnist()
    objective = oq.QuantizationObjective(
        str(demo_model),
        [data.x_train[i : i + 1] for i in range(64)],
        oq.Top1Accuracy(data.x_test, data.y_test),
        benchmark=fast_bench,
    )
    default = objective.space.default_params()
    assert objective.measure(default).acc_loss > 0.01
    # Keeping the consumer of the rescaled channels in fp32 is enough to meet the target.
    assert objective.measure({**default, "layer:/6/Conv": "fp32"}).acc_loss <= 0.01


def test_demo_script_end_to_end(demo_model, tmp_path, capsys) -> None:
    storage = f"sqlite:///{tmp_path}/demo.db"
    demo.main(["--trials", "6", "--storage", storage, "--export", str(tmp_path / "best.onnx")])
    out = capsys.readouterr().out
    assert "Best configuration:" in out
    assert f"optuna-dashboard {storage}" in out
    assert (tmp_path / "best.onnx").is_file()
    study = optuna.load_study(study_name="mnist-cnn-int8", storage=storage)
    assert len(study.trials) == 6
