"""The controller lease: only the holder of a lease row in the store acts.

A second controller (a backup head node) is safe: each cycle takes or renews the lease
for `[controller] lease_seconds`, and a cycle that did not get it acts on nothing. Taking
it never holds a cycle up: a store that does not answer within half an interval (locked
past its busy timeout, or down) leaves the cycle to run without the store
(`slurm_gpu.policy.store_outage`) until the lease it holds ends.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from slurm_gpu.config.policy import ControllerSettings
from slurm_gpu.errors import StoreError
from slurm_gpu.store.control import ControlStore

# The controller's modules log under one name, as before they were split (issue 25 item 7).
log = logging.getLogger("slurm_gpu.policy.controller")

LEASE = "controller"
"""The lease row's name in the store."""


def default_holder() -> str:
    """host:pid:random, unique per controller process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class ControllerLease:
    """This controller's hold on the lease: taken or renewed each cycle, given back at the end.

    Args:
        control: the store's controller bookkeeping, where the lease row lives.
        holder: this controller's lease identity.
        settings: [controller]: lease_seconds, and the interval half of which an attempt
            may take.
    """

    def __init__(self, control: ControlStore, holder: str, settings: ControllerSettings) -> None:
        self.control = control
        self.holder = holder
        self.settings = settings
        self.until: float | None = None
        """When the lease this controller holds ends (None: it holds none)."""
        self._attempt: threading.Thread | None = None

    def take(self, now: float) -> bool | None:
        """Takes or renews the lease; None when the store did not answer within half an interval.

        The attempt runs in a thread, so a store that waits out its busy timeout (SQLite
        locked) or a connect timeout does not hold the cycle up. An attempt still waiting
        from an earlier cycle is the probe: no second one is started beside it.

        Raises:
            StoreError: the store answered with an error.
        """
        if self._attempt is not None and self._attempt.is_alive():
            return None
        ttl = float(self.settings.lease_seconds)
        result: dict[str, Any] = {}

        def attempt() -> None:
            try:
                result["won"] = self.control.acquire_lease(LEASE, self.holder, now, ttl)
            except StoreError as exc:
                result["error"] = exc

        thread = threading.Thread(target=attempt, name="slurm-gpu-lease", daemon=True)
        thread.start()
        thread.join(float(self.settings.interval) / 2)
        if thread.is_alive():
            self._attempt = thread
            return None
        self._attempt = None
        if "error" in result:
            raise result["error"]
        won = bool(result["won"])
        self.until = now + ttl if won else None
        return won

    def release(self) -> None:
        """Gives the lease back (clean shutdown), so another controller need not wait."""
        try:
            self.control.release_lease(LEASE, self.holder)
        except StoreError as exc:
            log.warning("could not release the lease: %s", exc)
