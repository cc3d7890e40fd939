"""A torch.nn.Module goes in, is tuned as ONNX, and its fp32 layers come back by module name."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

import optuna_quant as oq


# The ONNX node of each tunable layer of the model below, and the torch module it comes from.
NODE_MODULES = {"node_conv2d": "0", "node_conv2d_1": "2", "node_linear": "5"}


def _module_and_data() -> tuple[nn.Module, np.ndarray, np.ndarray]:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 8 * 8, 4),
    ).eval()
    rng = np.random.default_rng(0)
    inputs = rng.random((64, 3, 8, 8), dtype=np.float32)
    with torch.no_grad():
        labels = model(torch.from_numpy(inputs)).argmax(1).numpy()
    return model, inputs, labels


def _torch_study(tmp_path, fast_bench, inputs: np.ndarray, model, **kwargs) -> oq.QuantStudy:
    """A layer-scope study of the module on SQLite; ``kwargs`` give the evaluation and targets."""
    return oq.create_study(
        model,
        [inputs[i : i + 1] for i in range(16)],
        example_inputs=torch.from_numpy(inputs[:1]),
        scopes=["layer"],
        sampler="random",
        seed=0,
        storage=f"sqlite:///{tmp_path}/torch.db",
        benchmark=fast_bench,
        **kwargs,
    )


def test_create_study_on_a_torch_module(tmp_path, fast_bench) -> None:
    model, inputs, labels = _module_and_data()
    study = _torch_study(tmp_path, fast_bench, inputs, model, eval_data=(inputs, labels), accuracy_loss=50.0)
    assert sorted(study.node_modules.values()) == ["0", "2", "5"]
    assert study.node_modules == NODE_MODULES  # which node is which module, not only the names
    layer_params = {f"layer:{node}" for node in study.node_modules}
    assert set(study.objective.space.distributions()) == layer_params
    first = f"layer:{next(iter(study.node_modules))}"
    study.enqueue_trial({name: ("fp32" if name == first else "int8") for name in layer_params})
    study.optimize(n_trials=3)
    best = study.best_result
    assert best is not None
    expected = sorted(
        study.node_modules[name.removeprefix("layer:")] for name, v in best.params.items() if v == "fp32"
    )
    assert sorted(study.fallback_modules()) == expected


def test_fallback_modules_of_a_known_best_trial(tmp_path, fast_bench) -> None:
    # Only the enqueued trial keeps the accuracy: it is the best, whatever the latencies, and it
    # keeps both convolutions in fp32.
    model, inputs, labels = _module_and_data()
    calls = {"n": 0}

    def only_the_enqueued_trial_is_accurate(session: ort.InferenceSession) -> float:
        calls["n"] += 1
        return 1.0 if calls["n"] in (1, 3) else 0.5  # fp32 baseline, reference, enqueued trial, ...

    study = _torch_study(
        tmp_path, fast_bench, inputs, model, eval_fn=only_the_enqueued_trial_is_accurate, accuracy_loss=1.0
    )
    assert study.node_modules == NODE_MODULES
    enqueued = {"layer:node_conv2d": "fp32", "layer:node_conv2d_1": "fp32", "layer:node_linear": "int8"}
    study.enqueue_trial(enqueued)
    study.optimize(n_trials=3)
    assert calls["n"] == 4  # the fp32 baseline and three trials, each evaluated once
    (trial,) = [t for t in study.trials if t.user_attrs["acc_loss"] == 0.0]
    assert trial.number == 0 and trial.params == enqueued and not trial.user_attrs.get("reference")
    best = study.best_result
    assert best is not None and best.number == 0
    assert study.fallback_modules() == ["0", "2"]  # node_conv2d -> "0", node_conv2d_1 -> "2", in node order


def test_a_non_model_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError):
        oq.create_study(object(), [np.zeros((1, 3), np.float32)], eval_fn=lambda s: 1.0,
                        storage=f"sqlite:///{tmp_path}/x.db")
