"""A study lock kept in the study's own records, for storages that have no lock of their own.

The lock is Lamport's bakery algorithm over the study's system attributes: each worker's lock
has a register, ``optuna_quant:lock:<id>`` = ``[choosing, ticket, renewed]``. To take the lock a
worker announces that it is choosing, reads every register, takes a ticket one above the
highest, then waits until no other worker is choosing and no other holds a lower ticket (ties
broken by the register's key); it releases the lock by setting its ticket to 0. Only reads and
writes of attributes are needed, one storage call each, so the lock works wherever the workers
share the storage: a journal file, a gRPC proxy (whose workers hold no database connection). It
lives and dies with the study: nothing shows in a listing of the storage's studies, and
``optuna.delete_study`` takes it with the study.

A worker that dies cannot release its ticket, so the lock is a lease: each register is renewed
every heartbeat interval while its worker waits or holds the lock, and a waiter that has seen a
register unchanged for the grace period clears it. A worker that finds it could not renew its own
register for the grace period (a paused process, a lost storage) draws a new ticket before it
takes the lock, since the others may have cleared its register meanwhile. The registers of
finished workers stay, with ticket 0; each is a few bytes of the study's system attributes.

Example:
    >>> import optuna
    >>> from optuna_quant.storages.heartbeat import Heartbeat
    >>> storage = optuna.storages.InMemoryStorage()
    >>> _ = optuna.create_study(storage=storage, study_name="demo")
    >>> lock = LeaseLock(storage, "demo", Heartbeat(interval=1, grace=3))
    >>> with lock():
    ...     pass
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import logging
import random
import threading
import time
from typing import Any
import uuid

from optuna.storages import BaseStorage

from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import repeating
from optuna_quant.storages.heartbeat import Silence


REGISTER_PREFIX = "optuna_quant:lock:"
_FIRST_POLL_SECONDS = 0.005
_POLL_SECONDS_PER_PLACE = 0.01
_MAX_POLL_SECONDS = 0.2
_logger = logging.getLogger("optuna_quant")


class LeaseLock:
    """The lock of ``study_name``, kept in its system attributes; see the module's docstring.

    Args:
        storage: The storage every worker of the study shares.
        study_name: The study, which must exist before the lock is first taken.
        heartbeat: Its interval is how often a register is renewed, its grace how long a waiter
            lets another's register stand unrenewed.
    """

    def __init__(self, storage: BaseStorage, study_name: str, heartbeat: Heartbeat) -> None:
        self.storage = storage
        self.study_name = study_name
        self.heartbeat = heartbeat
        self.key = REGISTER_PREFIX + uuid.uuid4().hex
        self._study_id: int | None = None
        self._choosing = False
        self._ticket = 0
        self._written = time.monotonic()
        self._stalled = False  # a gap of the grace period or more between two writes of the register
        self._writing = threading.Lock()  # the renewal thread and the taker write one register
        self._local = threading.Lock()  # one register: this process's threads take turns

    @contextmanager
    def __call__(self) -> Iterator[None]:
        with self._local, repeating(self._write, self.heartbeat.interval, at_once=False):
            held = False
            try:
                self._acquire()
                held = True
                yield
            finally:
                if held and self._stalled:
                    _logger.warning(
                        "The lock of %r may have been taken over while this worker held it.", self.study_name
                    )
                # Also when interrupted while waiting: a ticket left behind holds the others for
                # the grace period.
                self._write(choosing=False, ticket=0)

    def _acquire(self) -> None:
        while True:
            self._write(choosing=True, ticket=0)
            self._stalled = False
            tickets = [register[1] for register in self._registers().values()]
            self._write(choosing=False, ticket=1 + max(tickets, default=0))
            if self._wait_for_turn():
                return

    def _wait_for_turn(self) -> bool:
        """Poll until no register goes before this one: ``True``; ``False`` when this worker
        went unrenewed for the grace period, so that it draws again."""
        silence = Silence()
        poll = _FIRST_POLL_SECONDS
        mine = (self._ticket, self.key)
        while True:
            registers = self._registers()
            if self._stalled or time.monotonic() - self._written >= self.heartbeat.grace:
                _logger.warning(
                    "The lock of %r was not renewed for %s s by this worker; drawing again.",
                    self.study_name,
                    self.heartbeat.grace,
                )
                return False
            ahead = []
            for key, register in registers.items():
                choosing, ticket, _ = register
                if choosing or (ticket and (ticket, key) < mine):
                    if silence.seconds(key, tuple(register)) < self.heartbeat.grace:
                        ahead.append(key)
                    else:
                        self._clear(key, register)
            silence.keep(ahead)
            if not ahead:
                return True
            # Waiters spread out and back off, each by its place in the line: a handoff waits for
            # the next waiter's poll.
            time.sleep(poll * random.uniform(0.5, 1.5))
            poll = min(2 * poll, _POLL_SECONDS_PER_PLACE * len(ahead), _MAX_POLL_SECONDS)

    def _registers(self) -> dict[str, list[Any]]:
        """The other workers' registers, by key."""
        attrs = self.storage.get_study_system_attrs(self._id())
        return {key: value for key, value in attrs.items() if key.startswith(REGISTER_PREFIX) and key != self.key}

    def _write(self, *, choosing: bool | None = None, ticket: int | None = None) -> None:
        """Write this worker's register: the new state, or the same state renewed."""
        with self._writing:
            if choosing is not None:
                self._choosing = choosing
            if ticket is not None:
                self._ticket = ticket
            self.storage.set_study_system_attr(self._id(), self.key, [self._choosing, self._ticket, time.time()])
            now = time.monotonic()
            self._stalled = self._stalled or now - self._written >= self.heartbeat.grace
            self._written = now

    def _clear(self, key: str, register: list[Any]) -> None:
        _logger.warning(
            "The lock of %r was not renewed for %s s by one of its workers: it is dead.",
            self.study_name,
            self.heartbeat.grace,
        )
        self.storage.set_study_system_attr(self._id(), key, [False, 0, register[2]])

    def _id(self) -> int:
        if self._study_id is None:
            self._study_id = self.storage.get_study_id_from_name(self.study_name)
        return self._study_id
