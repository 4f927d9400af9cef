"""One client process: its share of the simulated nodes, each shipping once per its tick.

asyncio over raw HTTP/1.1 streams, one kept-alive connection per node as the agent's
CollectorSink keeps one (a connection the collector closed meanwhile is reopened and the
batch sent again with a fresh credential, as CollectorSink does; `--new-connections`: one
connection per batch, as the agent did before keep-alive). Each batch is signed by the real munged
(`Libmunge.encode` over the body's SHA-256 digest, as CollectorSink does; this process
runs as root, so the credential's uid is 0) and timed from signing to the collector's
answer: the agent's ship latency. A refused batch's rows wait and go again with the
node's next tick, as the spool keeps them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from load import INTERVAL, SimNode, body_of, tick_rows

from slurm_gpu.collector.wire import CREDENTIAL_HEADER, PATH, digest
from slurm_gpu.munge import Libmunge

SLICE = 0.005  # the scheduler wakes this often and sends what is due
DRAIN = 10.0  # seconds a step waits for its open requests after its end


@dataclass
class StepStats:
    """What one client saw in one step (summed over clients by the orchestrator)."""

    due: int = 0  # ticks due in the step
    fresh_rows: int = 0  # rows those ticks made (not counting rows shipped again)
    ok: int = 0
    ok_rows: int = 0  # rows of batches answered 200 within the step
    late_ok_rows: int = 0  # ... answered after it ended (drained)
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)  # send time - due time
    pending_rows: int = 0  # rows waiting at the end (refused, not yet accepted)
    cpu_seconds: float = 0.0


class Client:
    """The simulated agents of one process: their ticks, signatures and POSTs."""

    def __init__(
        self,
        host: str,
        port: int,
        nodes: list[SimNode],
        heartbeat: bool,
        change: float,
        munge_socket: str,
        in_flight: int,
        timeout: float,
        keep_alive: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.keep_alive = keep_alive
        # node number -> its open connection, while no request is on it
        self.conns: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.nodes = nodes
        self.heartbeat = heartbeat
        self.change = change
        self.munge = Libmunge(munge_socket)
        self.in_flight = in_flight
        self.timeout = timeout
        self.request_head = (
            f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\n" + ("" if keep_alive else "Connection: close\r\n")
        ).encode()

    async def step(
        self, multiple: float, start_at: float, seconds: float, every_node: bool = False
    ) -> StepStats:
        """Ships every node once per INTERVAL / multiple for `seconds` from `start_at`.

        A tick not sent by the end of the step (the clients saturated: `in_flight` requests
        open) is not sent; with `every_node`, each node ships one tick, however long it takes.
        """
        stats = StepStats()
        cpu0 = time.process_time()
        sem = asyncio.Semaphore(self.in_flight)
        tasks: set[asyncio.Task[None]] = set()
        n = len(self.nodes)
        gap = INTERVAL / multiple / n
        end = start_at + seconds
        total = n if every_node else math.ceil(seconds / gap)
        k = 0
        for node in self.nodes:  # each step on its own: no rows refused in the one before
            node.pending = ()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        while k < total and (every_node or time.time() < end):
            now = time.time()
            while k < total and start_at + k * gap <= now:
                due = start_at + k * gap
                node = self.nodes[k % n]
                k += 1
                await sem.acquire()
                stats.lags.append(time.time() - due)
                fresh = tick_rows(node, self.heartbeat, self.change)
                stats.due += 1
                stats.fresh_rows += len(fresh)
                rows = [*node.pending, *fresh]
                node.pending = ()
                task = asyncio.create_task(self._ship(node, rows, end, stats, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if not every_node and time.time() >= end:
                    break
            await asyncio.sleep(SLICE)
        stats.due = max(stats.due, total)  # ticks the step should have sent
        if tasks:
            # Answers still open a while after the step: late; then abandoned (a step that
            # leaves many has not held anyway), so the next step starts on time.
            await asyncio.wait(tasks, timeout=DRAIN)
            for task in list(tasks):
                task.cancel()
                stats.statuses["abandoned"] += 1
            await asyncio.gather(*tasks, return_exceptions=True)
        stats.pending_rows = sum(len(nd.pending) for nd in self.nodes)
        stats.cpu_seconds = time.process_time() - cpu0
        return stats

    async def _ship(
        self, node: SimNode, rows: list[str], end: float, stats: StepStats, sem: asyncio.Semaphore
    ) -> None:
        started = time.time()
        status = "error"
        try:
            body = body_of(node.name, f"{node.name}:{started!r}:{node.ticks}", started, rows)
            status = await asyncio.wait_for(self._post(node.number, body), self.timeout)
        except (TimeoutError, OSError, EOFError, ValueError) as exc:
            status = f"error:{type(exc).__name__}"
        finally:
            sem.release()
        done = time.time()
        stats.statuses[status] += 1
        stats.latencies.append(done - started)
        if status == "200":
            stats.ok += 1
            if done <= end:
                stats.ok_rows += len(rows)
            else:
                stats.late_ok_rows += len(rows)
        else:
            node.pending = (*rows, *node.pending)

    async def _post(self, number: int, body: bytes) -> str:
        """POSTs one batch on the node's connection; its status ("200")."""
        payload = digest(body).encode()
        kept = self.conns.pop(number, None)
        while True:
            conn = kept or await asyncio.open_connection(self.host, self.port)
            credential = self.munge.encode(payload)  # a credential decodes once: one each
            try:
                status, keep = await self._exchange(conn, body, credential)
            except (ConnectionError, asyncio.IncompleteReadError, _Stale):
                conn[1].close()
                if kept is not None:  # closed by the collector while idle: once more, anew
                    kept = None
                    continue
                raise
            except BaseException:  # timeout, cancelled: the connection's state is unknown
                conn[1].close()
                raise
            if keep and self.keep_alive:
                self.conns[number] = conn
            else:
                conn[1].close()
            return status

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], body: bytes, credential: str
    ) -> tuple[str, bool]:
        """One request and its answer: (status, whether the connection stays open)."""
        reader, writer = conn
        head = f"{CREDENTIAL_HEADER}: {credential}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(self.request_head + head.encode() + body)
        await writer.drain()
        status_line = await reader.readline()
        if not status_line:
            raise _Stale("closed before an answer")
        parts = status_line.split()
        if len(parts) < 2:
            raise ValueError(f"no HTTP status line: {status_line[:60]!r}")
        length, keep = 0, parts[0] == b"HTTP/1.1"
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
        await reader.readexactly(length)
        return parts[1].decode(), keep


class _Stale(OSError):
    """A kept connection the collector closed before answering."""


def serve(
    conn: Connection,
    host: str,
    port: int,
    numbers: list[int],
    origin: float,
    heartbeat: bool,
    change: float,
    munge_socket: str,
    in_flight: int,
    timeout: float,
    keep_alive: bool = True,
) -> None:
    """A client process: takes ("step", multiple, start_at, seconds, every_node) until ("stop",)."""
    # Past their first tick (their job's event, inventory and every GPU's first activity):
    # the steps measure the steady cadence.
    nodes = [SimNode(number=n, origin=origin, ticks=1, primed=True) for n in numbers]
    client = Client(
        host, port, nodes, heartbeat, change, munge_socket, in_flight, timeout, keep_alive
    )
    # One loop for every step: the connections stay open. They are not closed one by one
    # at the end (12,500 of them, slow): the process exits and the kernel closes them.
    loop = asyncio.new_event_loop()
    while True:
        message: tuple[Any, ...] = conn.recv()
        if message[0] == "stop":
            return
        _, multiple, start_at, seconds, every_node = message
        stats = loop.run_until_complete(client.step(multiple, start_at, seconds, every_node))
        conn.send(stats)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
