"""The simple recipes: which a model's space can build, and that a study runs them right after its reference."""

from __future__ import annotations

import onnx
import pytest

import optuna_quant as oq
from optuna_quant.trial import records
from optuna_quant.trial.recipes import recipe_params
from optuna_quant.trial.space import SearchSpace


def test_a_transformer_gets_the_dynamic_recipe_first_each_a_model_of_its_own(bert_path) -> None:
    space = SearchSpace.from_model(onnx.load(str(bert_path)))
    recipes = recipe_params(space)
    names = [name for name, _ in recipes]
    # Its reference is quantize_dynamic's defaults, dynamic per tensor: that recipe is measured already.
    reference = space.to_config(space.default_params())
    assert (reference.approach, reference.per_channel) == ("dynamic", False)
    assert names == ["dynamic_per_channel", "static_per_tensor", "static_per_channel", "static_default"]
    configs = [space.to_config(params) for _, params in recipes]
    assert len(set(configs) | {space.to_config(space.default_params())}) == len(configs) + 1
    assert all(not config.fallback for config in configs)  # every layer int8
    assert [config.approach for config in configs] == ["dynamic", "static", "static", "static"]


def test_a_cnn_gets_only_the_static_recipes_its_scopes_can_build(cnn) -> None:
    space = SearchSpace.from_model(cnn)
    assert [name for name, _ in recipe_params(space)] == ["static_per_tensor", "static_default"]
    narrow = SearchSpace.from_model(cnn, scopes=("layer", "range_estimator"))  # granularity off: per channel
    assert recipe_params(narrow) == []
    assert [name for name, _ in recipe_params(space, limit=1)] == ["static_per_tensor"]


@pytest.mark.parametrize("recipes", [True, False])
def test_a_study_measures_the_recipes_right_after_its_reference(
    tmp_path, bert_path, bert_feeds, bert_agreement, fast_bench, recipes
) -> None:
    study = oq.create_study(
        bert_path, bert_feeds, bert_agreement, sampler="random", seed=0, storage=f"sqlite:///{tmp_path}/s.db",
        benchmark=fast_bench, sensitivity=False, recipes=recipes,
    )
    study.optimize(n_trials=9)  # room for two recipes: one per four trials after the reference
    trials = study.study.trials
    queued = [(records.recipe(t), t.params) for t in trials[1:] if records.recipe(t) is not None]
    if not recipes:
        assert queued == [] and study.user_attrs.get("recipes") is None
        return
    assert queued == recipe_params(study.objective.space, limit=2)
    assert [records.recipe(t) for t in trials[1:3]] == ["dynamic_per_channel", "static_per_tensor"]
    assert all(records.measured(t) and "duplicate_of" not in t.user_attrs for t in trials[1:3])
