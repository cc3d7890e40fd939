from __future__ import annotations

import inspect
import logging

import pytest


torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from optuna_quant.qat import calibrate  # noqa: E402
from optuna_quant.qat import freeze_parameters  # noqa: E402
from optuna_quant.qat import group_parameters  # noqa: E402
from optuna_quant.qat import match_parameters  # noqa: E402
from optuna_quant.qat import quant_weight_inplace  # noqa: E402
from optuna_quant.qat import quantize_modules  # noqa: E402
from optuna_quant.qat import UncalibratedQuantizerError  # noqa: E402


torch.set_num_threads(1)


def small_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(12, 2))


def calibrated_model() -> nn.Sequential:
    model = quantize_modules(small_model())
    calibrate(model, [torch.randn(4, 1, 4, 4) for _ in range(2)])
    return model


def test_match_parameters_yields_once_per_matching_pattern() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    matched = list(match_parameters(model, ["weight", "0"]))
    assert [id(p) for p in matched] == [id(model[0].weight)] * 2 + [id(model[0].bias)]


def test_match_parameters_uses_re_search() -> None:
    model = small_model()
    assert list(match_parameters(model, [r"^3\.w"])) == [model[3].weight]
    assert list(match_parameters(model, ["nothing"])) == []


def test_match_parameters_is_a_one_shot_generator() -> None:
    matched = match_parameters(small_model(), ["weight"])
    assert inspect.isgenerator(matched)
    assert len(list(matched)) == 2
    assert list(matched) == []


@pytest.mark.parametrize("patterns", ["weight", ["weight", 3], [None]])
def test_match_parameters_rejects_non_string_patterns_at_call_time(patterns: object) -> None:
    with pytest.raises(TypeError, match="patterns"):
        match_parameters(small_model(), patterns)  # type: ignore[arg-type]


def test_group_parameters_one_group_per_pattern_list_with_given_options() -> None:
    model = small_model()
    groups = group_parameters(
        model, [["^0"], ["^3"]], lrs=[0.1, 0.2], momentums=[0.8, 0.9], weight_decays=[0.0, 1e-4]
    )
    assert [sorted(group) for group in groups] == [["lr", "momentum", "params", "weight_decay"]] * 2
    assert [(g["lr"], g["momentum"], g["weight_decay"]) for g in groups] == [
        (0.1, 0.8, 0.0),
        (0.2, 0.9, 1e-4),
    ]
    assert all(inspect.isgenerator(group["params"]) for group in groups)
    assert list(groups[1]["params"]) == [model[3].weight, model[3].bias]


def test_group_parameters_leaves_keys_absent_when_none() -> None:
    groups = group_parameters(small_model(), [["weight"], ["bias"]], lrs=[0.1, 0.2])
    assert [sorted(group) for group in groups] == [["lr", "params"], ["lr", "params"]]
    groups = group_parameters(small_model(), [["weight"]])
    assert list(groups[0]) == ["params"]


def test_group_parameters_feeds_an_optimizer() -> None:
    model = small_model()
    groups = group_parameters(model, [["^0"], ["^3"]], lrs=[1e-4, 1e-2], momentums=[0.9, 0.5])
    optimizer = torch.optim.SGD(groups, lr=1.0)
    assert [(g["lr"], g["momentum"]) for g in optimizer.param_groups] == [(1e-4, 0.9), (1e-2, 0.5)]
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 2]


@pytest.mark.parametrize(
    "patterns_list", [["weight"], (["weight"],), [["weight"], "bias"], "weight"]
)
def test_group_parameters_rejects_what_is_not_a_list_of_lists(patterns_list: object) -> None:
    with pytest.raises(TypeError, match="list of lists"):
        group_parameters(small_model(), patterns_list)  # type: ignore[arg-type]


@pytest.mark.parametrize("option", ["lrs", "momentums", "weight_decays"])
def test_group_parameters_rejects_option_lengths_that_differ(option: str) -> None:
    with pytest.raises(TypeError, match=f"len\\({option}\\)"):
        group_parameters(small_model(), [["weight"], ["bias"]], **{option: [0.1]})


def test_freeze_parameters_sets_requires_grad_false_on_matches_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = small_model()
    with caplog.at_level(logging.INFO, logger="optuna_quant.qat.helper"):
        freeze_parameters(model, [r"^0\."])
    assert [p.requires_grad for p in model.parameters()] == [False, False, True, True]
    assert "Freeze 0.weight." in caplog.text

    frozen = model[0].weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.randn(2, 1, 4, 4)).sum().backward()
    optimizer.step()
    assert model[0].weight.grad is None
    assert torch.equal(model[0].weight, frozen)


def test_freeze_parameters_rejects_a_bare_string() -> None:
    with pytest.raises(TypeError, match="single string"):
        freeze_parameters(small_model(), "weight")  # type: ignore[arg-type]


def test_quant_weight_inplace_writes_fake_quantized_weights_and_keeps_quantizers_on() -> None:
    model = calibrated_model()
    layers = [model[0], model[3]]
    expected = [layer.weight_quantizer(layer.weight).detach().clone() for layer in layers]
    assert not any(torch.equal(layer.weight, e) for layer, e in zip(layers, expected))

    quant_weight_inplace(model)
    for layer, e in zip(layers, expected):
        assert torch.equal(layer.weight, e)
        assert layer.weight_quantizer.enabled
        # On the int8 grid of its channel.
        scale = layer.weight_quantizer.amax / 127
        codes = layer.weight / scale.reshape(-1, *[1] * (layer.weight.dim() - 1))
        assert torch.allclose(codes, codes.round(), atol=1e-4)
        assert layer.weight.requires_grad

    quant_weight_inplace(model)
    for layer, e in zip(layers, expected):
        assert torch.equal(layer.weight, e)


def test_quant_weight_inplace_warns_without_quantized_module() -> None:
    model = small_model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="no quantized module"):
        quant_weight_inplace(model)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_quant_weight_inplace_warns_for_real_quantization() -> None:
    model = calibrated_model()
    model[3].weight_quantizer.fake_quant = False
    with pytest.warns(UserWarning, match="3: in-place real quantization"):
        quant_weight_inplace(model)
    assert torch.equal(model[3].weight, model[3].weight.round())


def test_quant_weight_inplace_needs_calibrated_weight_quantizers() -> None:
    with pytest.raises(UncalibratedQuantizerError, match="no amax"):
        quant_weight_inplace(quantize_modules(small_model()))
