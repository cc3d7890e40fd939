"""The choice between eval_fn and eval_data that create_study and probe share."""

from __future__ import annotations

import numpy as np
import pytest

from optuna_quant.measure.evaluate import eval_function
from optuna_quant.measure.evaluate import Top1Accuracy


def test_eval_fn_or_the_top1_accuracy_of_eval_data() -> None:
    def score(session: object) -> float:
        return 1.0

    assert eval_function(score, None) is score
    top1 = eval_function(None, (np.zeros((3, 2), np.float32), np.array([0, 1, 0])))
    assert isinstance(top1, Top1Accuracy) and top1.n_samples == 3
    for both_or_neither in ((score, (np.zeros((1, 2)), np.array([0]))), (None, None)):
        with pytest.raises(ValueError, match=r"^Give exactly one of eval_fn and eval_data\.$"):
            eval_function(*both_or_neither)
