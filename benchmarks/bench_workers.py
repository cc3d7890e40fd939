"""Worker scaling: trials per minute with 1 to 64 worker processes on one study, whose trials take a
fixed time, on PostgreSQL, through Optuna's gRPC proxy, and on an SQLite file (the default storage,
for the workers of one machine).

Each worker is its own process running ``create_study(..., trials_load_method="warm_start")`` and
``optimize``, as ``optuna-quant worker`` does on another machine, and everything it does is the
real worker's (the study lock, the heartbeat, the sampler's claim of a configuration, the
objective's look for a trial that holds the same one, the records, the dashboard's figures) but
the measurement: a stand-in sleeps ``--seconds`` instead of building and timing a model. So the
machine's cores measure what the workers spend coordinating, not computing. The sampler is
optuna-quant's TPE sampler kept on its random start-up draws (its model fit would be compute);
the space, 13 layers of a small random CNN, holds 8192 configurations.

Beside each run, the same number of plain Optuna workers (``optuna.load_study`` with Optuna's
``RandomSampler`` and ``optimize(n_trials=--rounds)``, no heartbeat, no lock, no budget shared
over the study) suggest the same 13 layers and sleep as long: the floor that Optuna itself sets
on this machine, so that the figures say what optuna-quant's protocol adds to it.

Reported per run, from the study's own timestamps: trials per minute in the steady state (from one
trial after the reference completed to one trial before the last trial completed, so that the
start and the end of the budget, where workers idle whatever the protocol, are left out), the
efficiency against one worker (rate / (workers x the rate of one)), the study lock's wait and
hold per trial and the wait's share of a trial's time, those of the configurations' locks
(the claims), the CPU seconds per trial of the worker processes and of the servers (the database,
and the proxy), and the SQL statements and transactions per trial that the database ran, every
client's counted by the server (``pg_stat_statements``). With ``--profile``, optuna-quant's workers
run under cProfile (timed by their CPU clock, so slower) and report their CPU per trial in each
part of a trial (:data:`ROLES`).

Run::

    .venv/bin/python -m benchmarks.bench_workers --storage postgresql --workers 1,8,32,64 --seconds 2
    .venv/bin/python -m benchmarks.bench_workers --storage grpc --workers 1,8,32,64 --seconds 2
    .venv/bin/python -m benchmarks.bench_workers --storage sqlite --workers 1,2 --seconds 2

A throwaway PostgreSQL server is started from Debian's binaries
(:func:`optuna_quant.testing.postgres.postgres_server`, as for the tests), and for ``grpc`` Optuna's
proxy in front of it (:func:`optuna_quant.testing.grpc_proxy.grpc_proxy`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from contextlib import ExitStack
import cProfile
from dataclasses import asdict
from dataclasses import dataclass
import json
import logging
import multiprocessing
import os
from pathlib import Path
import pstats
import resource
import statistics
import tempfile
import threading
import time


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import optuna  # noqa: E402
from optuna.storages import GrpcStorageProxy  # noqa: E402
import sqlalchemy  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from examples.tiny_cnn import build_cnn  # noqa: E402
from examples.tiny_cnn import calibration_data  # noqa: E402
import optuna_quant as oq  # noqa: E402
from optuna_quant.measure.latency import LatencyResult  # noqa: E402
from optuna_quant.measure.measurer import Measurement  # noqa: E402
from optuna_quant.storages.factory import open_storage  # noqa: E402
from optuna_quant.storages.lock import StudyLock  # noqa: E402
from optuna_quant.storages.urls import grpc_address  # noqa: E402
from optuna_quant.testing.grpc_proxy import grpc_proxy  # noqa: E402
from optuna_quant.testing.postgres import postgres_server  # noqa: E402


LAYERS = 12
"""Convolutions of the stand-in model: with its output layer, 13 layers, 8192 configurations."""
STORAGES = ("postgresql", "grpc", "sqlite")
ROLES: dict[str, list[tuple[str, ...]]] = {
    "decision": [("optuna_quant/storages/waiting.py", "watch", "optuna_quant/study/worker.py", "run")],
    "sampler": [
        ("optuna_quant/samplers/_tpe/sampler.py", "infer_relative_search_space"),
        ("optuna_quant/samplers/_gp/sampler.py", "infer_relative_search_space"),
        ("optuna_quant/samplers/_base.py", "sample_relative"),
    ],
    "claim": [("optuna_quant/trial/claim.py", "claim")],
    "records": [("optuna_quant/_optuna_private.py", "set_trial_attrs")],
    "parameter writes": [
        ("optuna/storages/_cached_storage.py", "set_trial_param"),
        ("optuna_quant/_optuna_private.py", "set_trial_params"),
    ],
    "Optuna's tell": [("optuna_quant/study/worker.py", "_tell")],
    "dashboard's figures": [
        ("optuna_quant/visualization/dashboard.py", "__call__"),
        ("optuna_quant/visualization/dashboard.py", "flush"),
    ],
}
"""Where ``--profile`` reads a worker's CPU: the functions of each part of a trial, by file and
name, and by the caller's where a function serves several parts (the decision's read of the
trials and its waits; the sampler includes its turn's polls of the lower-numbered trials)."""


PROTOCOLS = ("optuna-quant", "plain optuna")
MEASURED = Measurement(
    accuracy=0.99, acc_loss=0.01, latency=LatencyResult(fp32_ms=1.0, int8_ms=0.5, lat_diff=2.0, spread=0.0),
    quantize_seconds=0.0, eval_seconds=0.0, latency_seconds=0.0,
)


@dataclass
class WorkerCost:
    """What one worker process spent: its CPU, and its study lock's waits and holds."""

    cpu_seconds: float = 0.0
    locks: int = 0
    lock_wait: float = 0.0
    lock_hold: float = 0.0
    claim: WorkerCost | None = None
    """The configurations' locks (:func:`optuna_quant.storages.lock.claim_locks`)."""
    roles: dict[str, float] | None = None
    """With ``--profile``: CPU seconds in each of :data:`ROLES`."""


@dataclass
class Run:
    """One run of ``workers`` workers on a fresh study."""

    storage: str
    protocol: str
    workers: int
    seconds: float
    trials: int
    trials_per_minute: float
    median_trial_seconds: float
    worker_cpu_per_trial: float
    server_cpu_per_trial: float
    lock_wait_per_trial: float
    lock_hold_per_trial: float
    claim_wait_per_trial: float
    claim_hold_per_trial: float
    statements_per_trial: float | None
    """The server's count (PostgreSQL, behind the proxy too); ``None`` on SQLite, which has no server."""
    transactions_per_trial: float | None
    peak_connections: int | None = None
    """The most connections to the database at once during the run, the workers' (through the
    proxy: the proxy's); ``None`` on SQLite."""
    cpu_by_role_per_trial: dict[str, float] | None = None
    """With ``--profile``: the workers' CPU seconds per trial in each of :data:`ROLES`."""
    efficiency: float = 0.0


def timed(lock: StudyLock, cost: WorkerCost) -> StudyLock:
    """``lock``, adding each wait for it and each hold of it to ``cost``."""

    @contextmanager
    def timed_lock() -> Iterator[None]:
        asked = time.perf_counter()
        with lock():
            taken = time.perf_counter()
            try:
                yield
            finally:
                cost.locks += 1
                cost.lock_wait += taken - asked
                cost.lock_hold += time.perf_counter() - taken

    return timed_lock


def role_seconds(profile: cProfile.Profile) -> dict[str, float]:
    """CPU seconds of ``profile`` (timed by the process's CPU clock) in each of :data:`ROLES`."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]

    def seconds(path: str, name: str, *caller: str) -> float:
        total = 0.0
        for (file, _, function), (_, _, _, cumulative, callers) in stats.items():
            if file.endswith(path) and function == name:
                if not caller:
                    total += cumulative
                else:
                    total += sum(e[3] for (f, _, n), e in callers.items() if f.endswith(caller[0]) and n == caller[1])
        return total

    return {role: sum(seconds(*entry) for entry in entries) for role, entries in ROLES.items()}


def work(url: str, study_name: str, n_trials: int, seed: int, seconds: float, artifacts: str, profile: bool, ready, results) -> None:  # type: ignore[no-untyped-def]
    """One worker: the real one, whose measurement sleeps ``seconds``; its cost goes to ``results``,
    with ``profile`` where its CPU went (:data:`ROLES`), under cProfile."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    model = build_cnn(channels=(4,) * LAYERS, image_size=4)
    study = oq.create_study(
        model,
        calibration_data(model, n=2),
        lambda session: 1.0,
        accuracy_loss=5.0,
        latency_reduce=100.0,  # out of reach: every worker runs its whole share
        sampler=oq.TPESampler(n_startup_trials=10**9, seed=seed),
        scopes=("layer",),
        storage=url,
        study_name=study_name,
        trials_load_method="warm_start",
        pre_process=False,
        sensitivity=False,
        artifact_dir=artifacts,
    )
    logging.getLogger("optuna_quant").setLevel(logging.WARNING)

    def measure(config: object, watch: object = None, accuracy_watch: object = None) -> Measurement:
        time.sleep(seconds)
        return MEASURED

    study.objective.measurer.measure = measure
    study.objective.measurer.baseline = lambda: 1.0
    cost = WorkerCost(claim=WorkerCost())
    study.objective.lock = timed(study.objective.lock, cost)
    locks = study.objective.claim_locks
    study.objective.claim_locks = lambda key: timed(locks(key), cost.claim)
    profiler = cProfile.Profile(time.process_time) if profile else None
    ready.wait()  # every worker made: the runs start together
    before = resource.getrusage(resource.RUSAGE_SELF)
    if profiler is not None:
        profiler.enable()
    study.optimize(n_trials=n_trials)
    if profiler is not None:
        profiler.disable()
        cost.roles = role_seconds(profiler)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cost.cpu_seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    results.put(cost)


def plain_work(url: str, study_name: str, n_trials: int, seed: int, seconds: float, artifacts: str, profile: bool, ready, results) -> None:  # type: ignore[no-untyped-def]
    """One plain Optuna worker: ``n_trials // workers`` trials (``--rounds``) of the same stand-in."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    address = grpc_address(url)
    storage = url if address is None else GrpcStorageProxy(host=address[0], port=address[1])
    study = optuna.load_study(study_name=study_name, storage=storage, sampler=optuna.samplers.RandomSampler(seed=seed))

    def objective(trial: optuna.Trial) -> float:
        for layer in range(LAYERS + 1):
            trial.suggest_categorical(f"layer_{layer}", ["int8", "fp32"])
        time.sleep(seconds)
        return 1.0

    ready.wait()
    before = resource.getrusage(resource.RUSAGE_SELF)
    study.optimize(objective, n_trials=n_trials)
    after = resource.getrusage(resource.RUSAGE_SELF)
    results.put(WorkerCost(cpu_seconds=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)))


def steady_rate(trials: Sequence[optuna.trial.FrozenTrial], seconds: float) -> float:
    """Trials per minute completed from one trial after the reference (plain Optuna: the first trial)
    to one trial before the end."""
    first = next((t for t in trials if t.user_attrs.get("reference")), min(trials, key=lambda t: t.datetime_complete))
    start = first.datetime_complete.timestamp() + seconds
    end = max(t.datetime_complete for t in trials).timestamp() - seconds
    done = sum(1 for t in trials if t is not first and start < t.datetime_complete.timestamp() <= end)
    return 60 * done / (end - start)


def process_cpu(pids: Sequence[int]) -> float:
    """CPU seconds of the processes ``pids`` and of their children, live and ended."""
    ticks = 0
    children = {pid: [] for pid in pids}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent = int(fields[1])
            if parent in children or int(entry.name) in children:
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
                if int(entry.name) in children:
                    ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: children that ended
    return ticks / os.sysconf("SC_CLK_TCK")


def server_pids(database_url: str, proxy_url: str | None) -> list[int]:
    """The PostgreSQL server's main process and, for a proxy, the proxy's."""
    engine = sqlalchemy.create_engine(database_url)
    with engine.connect() as connection:
        backend = connection.execute(sqlalchemy.text("SELECT pg_backend_pid()")).scalar_one()
    postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    engine.dispose()
    pids = [postmaster]
    if proxy_url is not None:
        port = proxy_url.rsplit(":", 1)[1]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    command = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if "run_grpc_proxy_server" in command and f"port={port}" in command:
                    pids.append(int(entry.name))
    return pids


class StatementCounter:
    """The statements and transactions the PostgreSQL server ran in its database, from
    ``pg_stat_statements`` (the server started with it preloaded): every client's, the proxy's too."""

    def __init__(self, database_url: str) -> None:
        self.engine = sqlalchemy.create_engine(database_url)
        with self.engine.begin() as connection:
            connection.execute(sqlalchemy.text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
        # The server's own database watches the connections: its queries count in no study's.
        self.database = make_url(database_url).database
        self.watcher = sqlalchemy.create_engine(make_url(database_url).set(database="postgres"))

    def reset(self) -> None:
        with self.engine.begin() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_stat_statements_reset()"))

    def connections(self) -> int:
        """The client connections to the database now."""
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = :name AND backend_type = 'client backend'"
        with self.watcher.connect() as connection:
            return int(connection.execute(sqlalchemy.text(query), {"name": self.database}).scalar())

    @contextmanager
    def peak_connections(self, interval: float = 0.2) -> Iterator[list[int]]:
        """The most client connections the block added, in a list filled when the block ends;
        sampled every ``interval`` seconds."""
        baseline, peak, done = self.connections(), [0], threading.Event()

        def sample() -> None:
            while not done.wait(interval):
                peak[0] = max(peak[0], self.connections() - baseline)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        added: list[int] = []
        try:
            yield added
        finally:
            done.set()
            thread.join()
            added.append(peak[0])

    def counts(self) -> tuple[int, int]:
        """Statements and transactions (``BEGIN``) since the last :meth:`reset`."""
        query = (
            "SELECT coalesce(sum(calls), 0), coalesce(sum(calls) FILTER (WHERE query ILIKE 'begin%'), 0) "
            "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        with self.engine.connect() as connection:
            statements, transactions = connection.execute(sqlalchemy.text(query)).one()
        return int(statements), int(transactions)


def run(
    storage: str,
    protocol: str,
    url: str,
    database: str,
    servers: list[int],
    counter: StatementCounter | None,
    workers: int,
    rounds: int,
    seconds: float,
    label: str,
    profile: bool = False,
) -> Run:
    """Run ``workers`` worker processes on a fresh study until it holds ``workers * rounds`` trials.

    The workers open ``url``; this process opens the ``database`` behind it: a gRPC channel
    opened before a fork can hang the forked workers' own.
    """
    context = multiprocessing.get_context("fork")  # the workers share the parent's imports
    ready, results = context.Barrier(workers + 1), context.Queue()
    if protocol == "optuna-quant":
        target, n_trials = work, workers * rounds
    else:
        optuna.create_study(study_name=label, storage=open_storage(database))
        target, n_trials = plain_work, rounds
    with tempfile.TemporaryDirectory() as artifacts, ExitStack() as watching:
        connections = None if counter is None else watching.enter_context(counter.peak_connections())
        processes = [
            context.Process(target=target, args=(url, label, n_trials, seed, seconds, artifacts, profile, ready, results))
            for seed in range(workers)
        ]
        for process in processes:
            process.start()
        ready.wait()
        if counter is not None:
            counter.reset()
        server_cpu = process_cpu(servers)
        costs = [results.get() for _ in processes]
        for process in processes:
            process.join()
            if process.exitcode != 0:
                raise RuntimeError(f"a worker of {label} exited with {process.exitcode}")
        server_cpu = process_cpu(servers) - server_cpu
        statements, transactions = counter.counts() if counter is not None else (None, None)
    peak_connections = connections[0] if connections else None
    trials = optuna.load_study(study_name=label, storage=open_storage(database)).get_trials()
    return Run(
        storage=storage,
        protocol=protocol,
        workers=workers,
        seconds=seconds,
        trials=len(trials),
        trials_per_minute=steady_rate(trials, seconds),
        median_trial_seconds=statistics.median((t.datetime_complete - t.datetime_start).total_seconds() for t in trials),
        worker_cpu_per_trial=sum(c.cpu_seconds for c in costs) / len(trials),
        server_cpu_per_trial=server_cpu / len(trials),
        lock_wait_per_trial=sum(c.lock_wait for c in costs) / len(trials),
        lock_hold_per_trial=sum(c.lock_hold for c in costs) / len(trials),
        claim_wait_per_trial=sum(c.claim.lock_wait for c in costs if c.claim) / len(trials),
        claim_hold_per_trial=sum(c.claim.lock_hold for c in costs if c.claim) / len(trials),
        statements_per_trial=None if statements is None else statements / len(trials),
        transactions_per_trial=None if transactions is None else transactions / len(trials),
        peak_connections=peak_connections,
        cpu_by_role_per_trial=None
        if not any(c.roles for c in costs)
        else {role: sum(c.roles[role] for c in costs if c.roles) / len(trials) for role in ROLES},
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage", choices=STORAGES, default="postgresql", help="where the workers meet")
    parser.add_argument("--workers", default="1,8,32,64", help="worker counts, comma-separated (1 first)")
    parser.add_argument("--seconds", type=float, default=2.0, help="the stand-in trial's duration")
    parser.add_argument("--rounds", type=int, default=10, help="trials per worker")
    parser.add_argument("--json", type=Path, help="also write the runs to this file")
    parser.add_argument(
        "--profile", action="store_true", help="profile optuna-quant's workers: their CPU by part of a trial (slower: cProfile)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    with ExitStack() as stack:
        if args.storage == "sqlite":  # the default storage: one file, no server
            database = url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory())}/bench.db"
            counter, servers = None, []
        else:
            database = stack.enter_context(postgres_server(max_connections=4 * max(counts) + 20, preload=("pg_stat_statements",)))
            counter = StatementCounter(database)
            url = stack.enter_context(grpc_proxy(database)) if args.storage == "grpc" else database
            servers = server_pids(database, url if args.storage == "grpc" else None)
        print(f"load average before: {os.getloadavg()}", flush=True)
        runs: list[Run] = []
        for i, workers in enumerate(counts):
            for protocol in PROTOCOLS:  # side by side: the machine's load weighs on both alike
                result = run(args.storage, protocol, url, database, servers, counter, workers, args.rounds, args.seconds, f"bench-{workers}-{i}-{protocol}", args.profile)
                alone = next((r for r in runs if r.protocol == protocol), result)
                result.efficiency = result.trials_per_minute / (workers * alone.trials_per_minute / alone.workers)
                runs.append(result)
                print(
                    f"{args.storage} {protocol:>12} {workers:3d} worker(s): {result.trials_per_minute:7.1f} trials/min, "
                    f"efficiency {result.efficiency:.2f}; per trial: lock wait {1000 * result.lock_wait_per_trial:.0f} ms "
                    f"({result.lock_wait_per_trial / result.median_trial_seconds:.1%} of {result.median_trial_seconds:.2f} s), "
                    f"hold {1000 * result.lock_hold_per_trial:.0f} ms; claim's lock wait {1000 * result.claim_wait_per_trial:.0f} ms, "
                    f"hold {1000 * result.claim_hold_per_trial:.0f} ms; CPU {1000 * result.worker_cpu_per_trial:.0f} ms in "
                    f"workers + {1000 * result.server_cpu_per_trial:.0f} ms in servers"
                    + (
                        ""
                        if result.statements_per_trial is None
                        else f"; {result.statements_per_trial:.0f} statements in {result.transactions_per_trial:.0f} "
                        f"transactions; at most {result.peak_connections} connections"
                    ),
                    flush=True,
                )
                if result.cpu_by_role_per_trial is not None:
                    parts = ", ".join(f"{role} {1000 * cpu:.0f} ms" for role, cpu in result.cpu_by_role_per_trial.items())
                    print(f"    CPU per trial by part, under cProfile: {parts}", flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")


if __name__ == "__main__":
    main()
