"""``benchmarks/loto.py``: each fold chooses on the other tables, and the constants come back."""

from __future__ import annotations

import json

from benchmarks import loto
from optuna_quant.samplers import _prior


def _runs(medians: dict[str, float]) -> dict[str, dict[str, float]]:
    return {table: {sampler: medians.get(table, 4.0) for sampler in loto.SAMPLERS} for table in loto.TABLES}


def test_a_fold_chooses_on_the_other_tables_and_ties_keep_the_default() -> None:
    # 0.5 wins big on mlp alone, and loses a little on every other table.
    by_value = {1.0: _runs({}), 0.5: _runs({"mlp": 1.0, **{t: 4.5 for t in loto.TABLES if t != "mlp"}}), 2.0: _runs({})}
    judged = loto.folds(by_value, default=1.0, no_prior=_runs({"dwsep": 9.0}))
    assert judged["mlp"]["chosen"] == 1.0  # chosen without the table it is judged on
    assert judged["dwsep"] == {  # mlp is among the others: 0.5, judged worse on dwsep
        "chosen": 0.5,
        "with_chosen": {s: 4.5 for s in loto.SAMPLERS},
        "with_default": {s: 4.0 for s in loto.SAMPLERS},
        "without_prior": {s: 9.0 for s in loto.SAMPLERS},
    }
    # 2.0 costs what the default does everywhere: with 0.5 gone, the default stays.
    del by_value[0.5]
    assert {fold["chosen"] for fold in loto.folds(by_value, default=1.0, no_prior=_runs({})).values()} == {1.0}


def test_a_run_replays_every_table_and_restores_the_constants(tmp_path) -> None:
    out = tmp_path / "loto.json"
    report = loto.main(["--seeds", "1", "--constants", "FADED_AT", "--out", str(out)])
    assert _prior.FADED_AT == 1.0
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    runs = report["constants"]["FADED_AT"]["medians"]
    assert sorted(runs) == ["0.5", "1.0", "2.0"]
    assert all(set(runs[v]) == set(loto.TABLES) and all(m >= 1 for r in runs[v].values() for m in r.values()) for v in runs)
    assert set(report["constants"]["FADED_AT"]["folds"]) == set(loto.TABLES)
    assert loto.format_report(report).count("\n") == len(loto.TABLES) + 1
