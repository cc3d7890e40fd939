"""The best model as an artifact of its study, and the one writability check of the paths a run
writes to (create_study, export_best, the config file, the CLI)."""

from __future__ import annotations

from conftest import assert_int8_layers
import onnx
from optuna.artifacts import get_all_artifact_meta
import pytest

from optuna_quant.storages.artifacts import check_writable
from optuna_quant.storages.artifacts import model_filename
from optuna_quant.storages.artifacts import NotWritableError


def _refusal(path: object, what: str = "export", folder: bool = False) -> str:
    with pytest.raises(NotWritableError) as err:
        check_writable(path, what, folder=folder)  # type: ignore[arg-type]
    return str(err.value)


def test_missing_paths_under_a_writable_folder_pass_and_nothing_is_created(tmp_path) -> None:
    check_writable(tmp_path / "a" / "b" / "model.onnx", "export")
    check_writable(tmp_path / "a" / "store", "artifact_dir", folder=True)
    # The check of artifact_dir used to make the missing folders: a run refused later left them.
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_or_folder_passes_unchanged(tmp_path) -> None:
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"old")
    check_writable(existing, "export")
    check_writable(tmp_path, "artifact_dir", folder=True)
    assert existing.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [existing]


def test_a_path_of_the_wrong_kind_is_refused(tmp_path) -> None:
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"old")
    # An export path that is a folder used to pass create_study's check and fail in onnx.save.
    assert _refusal(tmp_path) == f"export: cannot write {tmp_path}: {tmp_path} is a folder, not a file."
    assert _refusal(existing, "artifact_dir", folder=True) == (
        f"artifact_dir: cannot write {existing}: {existing} is a file, not a folder."
    )


@pytest.mark.parametrize("folder", [False, True])
def test_a_path_beneath_a_file_names_that_file(tmp_path, folder) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = blocker / "deeper" / "best.onnx"
    assert _refusal(target, "--out", folder) == f"--out: cannot write {target}: {blocker} is a file, not a folder."


def test_a_relative_path_is_named_as_given_and_checked_from_here(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("")
    assert _refusal("taken/best.onnx") == f"export: cannot write taken/best.onnx: {tmp_path}/taken is a file, not a folder."
    check_writable("out/best.onnx", "export")
    assert not (tmp_path / "out").exists()


def test_writing_is_tried_not_os_access(tmp_path) -> None:
    # The superuser passes os.access on both, which the check of an existing export file used.
    assert _refusal("/proc/version").startswith("export: cannot write /proc/version: ")
    assert _refusal("/proc/self/model.onnx").startswith("export: cannot write /proc/self/model.onnx: ")
    assert _refusal("/proc/no-such-folder", "artifact_dir", folder=True).startswith(
        "artifact_dir: cannot write /proc/no-such-folder: "
    )

def test_export_path_is_checked_before_the_model_is_built(tmp_path, make_study, monkeypatch) -> None:
    study = make_study()
    study.optimize(n_trials=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    built = []
    monkeypatch.setattr(study.objective, "build", lambda params: built.append(params))
    with pytest.raises(NotWritableError, match=r"export path: cannot write .*a-file/best\.onnx: .*a-file is a file, not a folder\."):
        study.export_best(blocker / "best.onnx")
    assert built == []


def test_best_model_is_an_artifact_and_loss_is_named(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3)
    assert study.study.metric_names == ["loss"]
    files = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert files == [model_filename(best.number)]
    study.export_best(tmp_path / "out" / "best.onnx")  # the same model: not stored twice; the folder made
    assert len(get_all_artifact_meta(study.study)) == 1
    assert len(list((tmp_path / "study-artifacts").iterdir())) == 1
    # The exported file is the stored artifact, and the int8 model of the best trial.
    (stored,) = (tmp_path / "study-artifacts").iterdir()
    assert (tmp_path / "out" / "best.onnx").read_bytes() == stored.read_bytes()
    assert_int8_layers(onnx.load(str(tmp_path / "out" / "best.onnx")), best.params)
