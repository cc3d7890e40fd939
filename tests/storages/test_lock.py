"""The study lock of every storage that workers share, across real processes: one holder at a
time, and a holder killed while it holds the lock does not keep it. Storages no lock fits are
refused before anything is stored."""

from __future__ import annotations

from pathlib import Path
import signal
import subprocess
import sys
import threading
import time

from conftest import subprocess_env
import optuna
import pytest

import optuna_quant as oq
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lease import REGISTER_PREFIX
from optuna_quant.storages.lock import claim_locks
from optuna_quant.storages.lock import study_lock
from optuna_quant.storages.lock import UnsupportedStorageError
from optuna_quant.storages.urls import StorageError


SCRIPT = Path(__file__).parents[1] / "lock_script.py"
WORKERS, TIMES = 3, 15
TIMEOUT = 300  # processes that start on a loaded 2-core machine


@pytest.fixture
def url(shared_url: str) -> str:
    return shared_url


def _start(url: str, study: str, count: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, str(SCRIPT), url, "--study", study, "--count", str(count), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env())


@pytest.mark.slow
def test_one_holder_at_a_time_and_a_killed_holder_keeps_nothing(url: str, tmp_path: Path) -> None:
    count = tmp_path / "count"
    count.write_text("0")
    study = f"lock-{tmp_path.name}"
    workers = [_start(url, study, count, "--times", str(TIMES)) for _ in range(WORKERS)]
    for worker in workers:
        output, _ = worker.communicate(timeout=TIMEOUT)
        assert worker.returncode == 0, output[-3000:]
    assert int(count.read_text()) == WORKERS * TIMES  # no addition lost: never two holders
    held = tmp_path / "held"
    dead = _start(url, study, count, "--die-holding", str(held))
    assert dead.wait(timeout=TIMEOUT) == -signal.SIGKILL and held.read_text() == "held"
    # The next worker takes the lock: at once from a database, after the grace period from a lease.
    after = _start(url, study, count, "--times", "1")
    output, _ = after.communicate(timeout=TIMEOUT)
    assert after.returncode == 0, output[-3000:]
    assert int(count.read_text()) == WORKERS * TIMES + 1


class _OwnStorage(optuna.storages.BaseStorage):
    """A storage class of the user's own (here one that keeps its studies in memory, which
    optuna-quant cannot tell): it cannot tell whether its workers share a lock either."""

    def __init__(self) -> None:
        self.inner = optuna.storages.InMemoryStorage()


for _name in optuna.storages.BaseStorage.__abstractmethods__:
    setattr(_OwnStorage, _name, lambda self, *args, _name=_name, **kwargs: getattr(self.inner, _name)(*args, **kwargs))
_OwnStorage.__abstractmethods__ = frozenset()


@pytest.mark.parametrize(
    "storage, named",
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("oracle+oracledb://quant:s3cret@db.example.com/studies", "quant:***@db.example.com"),
        (_OwnStorage(), "_OwnStorage"),
    ],
    ids=["redis", "another-database", "own-storage-class"],
)
def test_a_storage_no_lock_fits_is_refused_before_anything_is_stored(
    storage, named: str, tmp_path, monkeypatch, calib, agreement
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as err:
        oq.create_study(tmp_path / "missing.onnx", calib, agreement, storage=storage, study_name="refused")
    message = str(err.value)
    assert named in message and "s3cret" not in message
    assert "journal:PATH" in message and "grpc://HOST:PORT" in message  # what to use instead
    assert list(tmp_path.iterdir()) == []
    if isinstance(storage, optuna.storages.BaseStorage):
        assert isinstance(err.value, UnsupportedStorageError)
        assert storage.get_all_studies() == []


@pytest.mark.parametrize("where", ["journal", "grpc_url"])
def test_a_lease_lives_in_its_study_and_is_deleted_with_it(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"journal:{tmp_path}/study.log" if where == "journal" else request.getfixturevalue(where)
    storage = open_storage(url)
    optuna.create_study(storage=storage, study_name="leased")
    first, second = (study_lock(storage, "leased", Heartbeat(interval=1, grace=30)) for _ in range(2))
    taken = threading.Event()

    def take_second() -> None:
        with second():
            taken.set()

    with first():
        thread = threading.Thread(target=take_second, daemon=True)
        thread.start()
        assert not taken.wait(timeout=1.0)  # one holder at a time
    assert taken.wait(timeout=60.0)  # the waiter's turn once the holder released
    thread.join()
    attrs = storage.get_study_system_attrs(storage.get_study_id_from_name("leased"))
    registers = [key for key in attrs if "lock" in key]
    assert len(registers) == 2  # one register a lock, in the study's own records
    # The proxy's database is the module's: other tests' studies are listed beside this one.
    names = {summary.study_name for summary in optuna.get_all_study_summaries(storage)}
    assert "leased" in names and not [name for name in names if name.startswith("leased") and name != "leased"]
    optuna.delete_study(study_name="leased", storage=storage)
    left = [summary.study_name for summary in optuna.get_all_study_summaries(storage)]
    assert not [name for name in left if name.startswith("leased")]


def test_a_dead_workers_ticket_holds_the_lease_for_the_grace_period_then_is_cleared(tmp_path: Path) -> None:
    storage = open_storage(f"journal:{tmp_path}/study.log")
    optuna.create_study(storage=storage, study_name="s")
    study_id = storage.get_study_id_from_name("s")
    dead = REGISTER_PREFIX + "dead"
    storage.set_study_system_attr(study_id, dead, [False, 1, 0.0])  # a ticket ahead, never renewed
    start = time.monotonic()
    with study_lock(storage, "s", Heartbeat(interval=0.2, grace=1))():
        waited = time.monotonic() - start
    assert waited >= 1  # no sooner than the grace period
    assert storage.get_study_system_attrs(study_id)[dead][:2] == [False, 0]


def test_a_storage_in_memory_gets_a_lock_of_this_process(tmp_path: Path) -> None:
    for storage in (optuna.storages.InMemoryStorage(), open_storage("sqlite:///:memory:")):
        lock = study_lock(storage, "alone", Heartbeat())
        with lock():
            pass
        assert lock() is lock()  # one lock object for the study in this process


@pytest.mark.parametrize("database", ["postgres_url", "mariadb_url"])
def test_claims_of_two_configurations_do_not_wait_on_each_other(database: str, request: pytest.FixtureRequest) -> None:
    storage = open_storage(request.getfixturevalue(database))
    locks = claim_locks(storage, "claims", Heartbeat())

    def taken_beside(key: str, seconds: float) -> bool:
        """Whether another thread (its own connection) takes ``key``'s lock within ``seconds``."""
        done = threading.Event()

        def take() -> None:
            with locks(key)():
                done.set()

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        return done.wait(timeout=seconds)

    with locks("a")():
        assert taken_beside("b", 60.0)  # a new connection on a loaded machine may take seconds
        assert not taken_beside("a", 2.0)  # waits for this holder; it takes the lock once it is released
