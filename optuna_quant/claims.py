"""Claims that workers of one study hold on shared work, and how a worker tells a claim was abandoned.

A worker is named ``"host:pid"``. It refreshes a claim while it works on it and releases it if
the work fails (:class:`KeepClaim`); others wait on the claim (:class:`ClaimWatch`) and take the
work over once it is released, when it stops changing for ``CLAIM_STALE_SECONDS``, or at once when
its worker is a dead process of this machine. Clocks of two machines differ, so a claim is judged
by whether it changes, as seen from here.

Example:
    >>> dead_here(WORKER)  # this process: its claim may be another thread's, still working
    False
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import optuna

REFERENCE_CLAIM_KEY = "reference_claim"
WORKER = f"{socket.gethostname()}:{os.getpid()}"
POLL_SECONDS = 0.2
CLAIM_REFRESH_SECONDS = 5.0
CLAIM_STALE_SECONDS = 30.0


class ClaimWatch:
    """Waits on a claim of another worker, and tells when that worker stopped refreshing it."""

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.seen: object = None
        self.since = time.monotonic()

    def abandoned(self, claim: dict[str, Any] | None) -> bool:
        """Whether ``claim`` is absent, this machine's and dead, or unchanged for ``CLAIM_STALE_SECONDS``."""
        if claim is None or dead_here(claim["worker"]):
            return True
        # Clocks of two machines differ: a claim is judged by whether it changes, seen from here.
        if claim != self.seen:
            self.seen, self.since = claim, time.monotonic()
        return time.monotonic() - self.since > CLAIM_STALE_SECONDS

    def wait(self, what: str) -> None:
        """Sleep a little, or raise once the timeout is spent."""
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"Waited {self.timeout:.0f} s for {what}; is that worker stuck?")
        time.sleep(POLL_SECONDS)


def dead_here(worker: str) -> bool:
    """Whether ``worker`` ("host:pid") is a process of this machine that is gone."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


class KeepClaim:
    """Refreshes this worker's reference claim while it measures, so others see it is alive.

    If the measurement raises, the claim is released, so that the next call (of this worker or
    another) measures the reference at once instead of waiting for the claim to turn stale.
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._refresh, daemon=True)

    def __enter__(self) -> None:
        self.thread.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop.set()
        self.thread.join()  # before releasing: a refresh written after it would claim again
        if exc_type is not None:
            self.study.set_user_attr(REFERENCE_CLAIM_KEY, None)

    def _refresh(self) -> None:
        beat = 0
        while not self.stop.wait(CLAIM_REFRESH_SECONDS):
            beat += 1
            self.study.set_user_attr(REFERENCE_CLAIM_KEY, {"worker": WORKER, "beat": beat})
