"""A torch.nn.Module goes in, is tuned as ONNX, and its fp32 layers come back by module name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import optuna_quant as oq


def test_create_study_on_a_torch_module(tmp_path, fast_bench) -> None:
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
    study = oq.create_study(
        model,
        [inputs[i : i + 1] for i in range(16)],
        eval_data=(inputs, labels),
        example_inputs=torch.from_numpy(inputs[:1]),
        scopes=["layer"],
        sampler="random",
        seed=0,
        storage=f"sqlite:///{tmp_path}/torch.db",
        benchmark=fast_bench,
        accuracy_loss=50.0,
    )
    assert sorted(study.node_modules.values()) == ["0", "2", "5"]
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


def test_a_non_model_is_refused(tmp_path) -> None:
    with pytest.raises(TypeError):
        oq.create_study(object(), [np.zeros((1, 3), np.float32)], eval_fn=lambda s: 1.0,
                        storage=f"sqlite:///{tmp_path}/x.db")
