"""Asking nodes to ship now, before the controller cancels one of their jobs (issue 26).

With `[node] ship_interval` a node's rows wait in its spool up to that long: the
controller would judge a job on readings up to a minute old. Before it cancels a job for
what its GPUs did, it asks each of the job's nodes over NATS (a request on
`<flush_prefix>.<cluster>.<node>`); the node's shipper ships at once and answers once the
store has committed what it held, with the time its data runs through. The controller
then reads the store again and decides on that. A node that does not answer in time is
judged on what the store has, as without the request: its readings are late (unknown,
never idle) if they are older than the rules allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.jetstream.bus import Bus, BusError, flush_subject
from slurm_gpu.node.shipper import Shipper


class FlushRequests:
    """The agent's side: requests wake the shipper; answered after its next pass.

    Args:
        bus: the agent's NATS connection (its sink's).
        subject: `flush_subject` of this node.
        wake: set on a request; the shipper's wait ends on it (`Shipper.run`).
    """

    def __init__(self, bus: Bus, subject: str, wake: threading.Event) -> None:
        self.bus = bus
        self.subject = subject
        self.wake = wake
        self._pending: list[tuple[float, Msg]] = []
        self._lock = threading.Lock()
        self._subscription: Subscription | None = None

    def listen(self) -> None:
        """Subscribes (again after a failure: call it before every pass)."""
        if self._subscription is not None:
            return

        async def on_request(msg: Msg) -> None:
            with self._lock:
                self._pending.append((time.time(), msg))
            self.wake.set()

        client = self.bus.client()
        self._subscription = self.bus.call(client.subscribe(self.subject, cb=on_request))

    def answer(self, through: float) -> int:
        """Answers the requests taken before `through`, when a pass began that has shipped.

        What the spool held then is in the store: the node's data runs through it. A
        request taken after it waits for the next pass (its `wake` is still set). Returns
        how many were answered.
        """
        with self._lock:
            answered = [m for at, m in self._pending if at <= through]
            self._pending = [(at, m) for at, m in self._pending if at > through]
        body = json.dumps({"through": through}).encode()
        for msg in answered:
            # A failed answer: the controller stopped waiting and judges without it.
            with contextlib.suppress(BusError):
                self.bus.call(msg.respond(body))
        return len(answered)


def serve_flush_requests(shipper: Shipper, bus: Bus, subject: str) -> FlushRequests:
    """Lets requests on `subject` wake `shipper`, answered once its pass has shipped."""
    requests = FlushRequests(bus, subject, shipper.wake)
    shipper.before_pass, shipper.after_pass = requests.listen, requests.answer
    return requests


def ask_to_flush(
    bus: Bus, settings: NatsSettings, cluster: str, nodes: Sequence[str], timeout: float
) -> dict[str, float | None]:
    """{node: the time its data runs through, None where it did not answer in time}.

    All nodes are asked at once; the whole takes at most `timeout` seconds.
    """
    client = bus.client()

    async def one(node: str) -> float | None:
        try:
            reply = await client.request(
                flush_subject(settings, cluster, node), b"", timeout=timeout
            )
            return float(json.loads(reply.data)["through"])
        except (NatsError, TimeoutError, ValueError, KeyError, TypeError):
            return None  # no answer (no responder, timed out, garbled): judged without it

    async def every() -> list[float | None]:
        return list(await asyncio.gather(*(one(n) for n in nodes)))

    if not nodes:
        return {}

    answers = bus.call(every(), timeout=timeout + bus.timeout)
    return dict(zip(nodes, answers, strict=True))
