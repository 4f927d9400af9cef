"""bench/scale --transport nats: what each stage of the NATS JetStream path costs per unit.

Starts its own PostgreSQL (as scale.py does), `slurm-gpu db upgrade`, its own nats-server
with JetStream on a free loopback port (no authorization: the bench's publishers are not
the nodes' keys), and `--workers` ingest workers (`slurm-gpu ingest run`, each a process of
its own with one store connection and its metrics endpoint). Publisher processes
(publisher.py) drive the simulated nodes through the product's NatsSink at fixed offered
rates below saturation (multiples of production: 12,500 nodes, one batch a node per 10 s
tick), at two batch shapes (ticks a message: [node] ship_interval 0 and 60 s). Over each
step it takes each stage's own CPU from /proc/<pid>/stat (publishers, nats-server, the
workers, PostgreSQL's backends and its other processes) and reports it per message, per row
and per store transaction, net of what the stage uses idle; then the cores each stage needs
at 10x production. Everything it started is stopped by pid at the end, on an error or
Ctrl-C too. See README.md, "NATS mode".
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psycopg
from client import percentile
from load import INTERVAL, heartbeat_mode
from load import rows_per_second as required_rates
from publisher import PubStats, serve
from scale import (
    VENV,
    _end_process,
    _interrupted,
    code_version,
    free_port,
    start_postgres,
    started,
    use_existing_pg,
    wait_for,
)
from seed import CLUSTER

NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"
STREAM = "SLURM_GPU_BATCHES"  # [nats] stream's default (the workers' config keeps it)
GOAL_WORKERS = 4.0  # cores at 10x production (issue 26)
GOAL_NATS = 2.0
FLAT = 0.10  # per-unit cost within this spread over the rates: flat
STAGES = ("pub", "nats", "wrk", "pgB", "pgS")
STAGE_NAMES = {
    "pub": "publishers (the agents' side)",
    "nats": "nats-server",
    "wrk": "ingest workers",
    "pgB": "PostgreSQL backends",
    "pgS": "PostgreSQL's other processes",
}
CLK = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command's name, None when it is gone."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cpu(fields: list[str] | None, children: bool = False) -> float:
    """utime + stime (+ cutime + cstime) in seconds."""
    if fields is None:
        return 0.0
    total = int(fields[11]) + int(fields[12])
    if children:
        total += int(fields[13]) + int(fields[14])
    return total / CLK


def machine_busy() -> float:
    """CPU seconds this machine spent busy so far, all processes (/proc/stat: not idle, iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLK


def threads_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of `pid`, by thread id."""
    out: dict[int, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        out[int(task.name)] = _cpu(_stat(task / "stat"))
    return out


@dataclass
class Snapshot:
    """The stages' CPU seconds so far, per stage and per thread/process, and the counters."""

    at: float
    cpu: dict[str, float]
    parts: dict[str, dict[str, float]]  # stage -> "pid/tid" or process -> CPU seconds
    metrics: dict[str, float]  # the workers' counters, summed
    wal: dict[str, float]  # pg_stat_wal
    varz: dict[str, float]  # nats-server's in_msgs, out_msgs, in_bytes, out_bytes
    machine: float  # this machine's busy CPU seconds (every process: /proc/stat)


@dataclass
class Used:
    """What a stage used between two snapshots."""

    seconds: float
    cpu: dict[str, float]
    parts: dict[str, dict[str, float]]
    metrics: dict[str, float]
    wal: dict[str, float]
    varz: dict[str, float]
    machine: float

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> Used:
        """b - a."""
        parts = {
            s: {k: v - a.parts.get(s, {}).get(k, 0.0) for k, v in b.parts[s].items()}
            for s in b.parts
        }
        return cls(
            b.at - a.at,
            {s: b.cpu[s] - a.cpu[s] for s in b.cpu},
            parts,
            {k: b.metrics.get(k, 0.0) - a.metrics.get(k, 0.0) for k in b.metrics},
            {k: b.wal.get(k, 0.0) - a.wal.get(k, 0.0) for k in b.wal},
            {k: b.varz.get(k, 0.0) - a.varz.get(k, 0.0) for k in b.varz},
            b.machine - a.machine,
        )


class Stages:
    """The processes of each stage, and how to read what they used."""

    def __init__(
        self,
        publishers: list[int],
        nats: int,
        workers: list[int],
        pg: int | None,
        database: str,
        metrics_urls: list[str],
        admin: str,
        monitor: str,
    ) -> None:
        self.monitor = monitor
        self.publishers, self.nats, self.workers, self.pg = publishers, nats, workers, pg
        self.database, self.metrics_urls, self.admin = database, metrics_urls, admin
        self.conn = psycopg.connect(admin, autocommit=True)  # the bench's own (not counted)

    def snapshot(self) -> Snapshot:
        """Now."""
        parts: dict[str, dict[str, float]] = {s: {} for s in STAGES}
        for pid in self.publishers:
            parts["pub"][str(pid)] = _cpu(_stat(Path(f"/proc/{pid}/stat")))
        parts["nats"] = {f"t{t}": c for t, c in threads_cpu(self.nats).items()}
        for n, pid in enumerate(self.workers):
            for tid, c in threads_cpu(pid).items():
                parts["wrk"][f"w{n}:{'main' if tid == pid else tid}"] = c
        if self.pg is not None:
            self._postgres(parts)
        cpu = {s: sum(parts[s].values()) for s in STAGES}
        # A process's own stat counts its threads that ended too (e.g. the metrics
        # endpoint's request threads): the stage totals are the processes'.
        cpu["nats"] = _cpu(_stat(Path(f"/proc/{self.nats}/stat")))
        cpu["wrk"] = sum(_cpu(_stat(Path(f"/proc/{pid}/stat"))) for pid in self.workers)
        return Snapshot(
            time.monotonic(),
            cpu,
            parts,
            self.worker_metrics(),
            self.wal(),
            self.varz(),
            machine_busy(),
        )

    def varz(self) -> dict[str, float]:
        """nats-server's message and byte counters."""
        with urllib.request.urlopen(f"{self.monitor}/varz", timeout=5) as r:
            data = json.loads(r.read())
        out = {k: float(data.get(k, 0)) for k in ("in_msgs", "out_msgs", "in_bytes", "out_bytes")}
        for name, stream in streams(self.monitor).items():  # appends to each stream
            out[f"seq:{name}"] = float(stream["state"]["last_seq"])
        return out

    def _postgres(self, parts: dict[str, dict[str, float]]) -> None:
        """The postmaster (and its ended children) and its live children, by kind."""
        assert self.pg is not None
        parts["pgS"]["postmaster"] = _cpu(_stat(Path(f"/proc/{self.pg}/stat")), children=True)
        mine = f" {self.database} "
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat(entry / "stat")
            if fields is None or int(fields[1]) != self.pg:
                continue
            try:
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if mine in title:  # a backend of the store's database: the workers' connections
                parts["pgB"][entry.name] = _cpu(fields)
            elif " postgres 127.0.0.1(" in title or "[local]" in title:
                continue  # the bench's own connection (sampling): not the store's cost
            else:  # walwriter, checkpointer, background writer, autovacuum ...
                name = title.removeprefix("postgres: ").split(" ")[0]
                parts["pgS"][f"{name}:{entry.name}"] = _cpu(fields)

    def worker_metrics(self) -> dict[str, float]:
        """The workers' slurm_gpu_ingest_* counters, summed over them."""
        out: dict[str, float] = {}
        for url in self.metrics_urls:
            with urllib.request.urlopen(url, timeout=5) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("slurm_gpu_ingest_") and not line.startswith("#"):
                        name, value = line.rsplit(" ", 1)
                        name = name.split("{", 1)[0]
                        if name.endswith("_created"):
                            continue
                        out[name] = out.get(name, 0.0) + float(value)
        return out

    def wal(self) -> dict[str, float]:
        """pg_stat_wal (empty with --pg-url's server older than 14)."""
        try:
            row = self.conn.execute(
                "SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_sync_time FROM pg_stat_wal"
            ).fetchone()
        except psycopg.Error:
            return {}
        if row is None:
            return {}
        keys = ("records", "bytes", "write", "sync", "sync_ms")
        return {k: float(v) for k, v in zip(keys, row, strict=True)}

    def close(self) -> None:
        """Closes the bench's connection."""
        self.conn.close()


class Sampler(threading.Thread):
    """The store's client connections (pg_stat_activity), every 0.25 s."""

    def __init__(self, admin: str, database: str) -> None:
        super().__init__(daemon=True)
        self.admin, self.database = admin, database
        self.most = 0
        self.stop = threading.Event()

    def reset(self) -> int:
        """The most connections seen since the last reset."""
        most, self.most = self.most, 0
        return most

    def run(self) -> None:
        """Samples until `stop` is set."""
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self.stop.wait(0.25):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = %s AND backend_type = 'client backend'",
                    (self.database,),
                ).fetchone()
                self.most = max(self.most, int(row[0]) if row else 0)


def answers(url: str) -> bool:
    """Whether `url` answers 200."""
    with urllib.request.urlopen(url, timeout=2) as r:
        return bool(r.status == 200)


def jsz(monitor: str) -> dict[str, Any]:
    """nats-server's /jsz with streams and consumers."""
    with urllib.request.urlopen(f"{monitor}/jsz?streams=true&consumers=true", timeout=5) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def streams(monitor: str) -> dict[str, dict[str, Any]]:
    """The streams' details by name."""
    out: dict[str, dict[str, Any]] = {}
    for account in jsz(monitor).get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            out[stream["name"]] = stream
    return out


def settle(monitor: str, most: float = 60.0) -> None:
    """Waits until the batch stream holds nothing (work queue: every message acked)."""
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        stream = streams(monitor).get(STREAM)
        if stream is not None and int(stream["state"]["messages"]) == 0:
            return
        time.sleep(0.5)
    print(f"scale-nats: the stream still held messages after {most:.0f}s", file=sys.stderr)


def merge(stats: Iterable[PubStats]) -> PubStats:
    """The publisher processes' figures of one step, summed."""
    out = PubStats()
    for s in stats:
        out.due += s.due
        out.committed += s.committed
        out.rows += s.rows
        out.sized += s.sized
        out.body_bytes += s.body_bytes
        out.busy += s.busy
        out.failed += s.failed
        out.latencies += s.latencies
        out.acks += s.acks
        out.lags += s.lags
        out.polls += s.polls
        out.pending_rows += s.pending_rows
        out.abandoned += s.abandoned
    return out


@dataclass
class Step:
    """One step's figures: traffic, and CPU net of the stages' idle use."""

    ticks: int
    multiple: float
    stats: PubStats
    used: Used
    idle: dict[str, float]  # cores each stage uses with no traffic
    conns: int
    net: dict[str, float] = field(default_factory=dict)  # CPU seconds over idle

    def __post_init__(self) -> None:
        for s in STAGES:
            self.net[s] = self.used.cpu[s] - self.idle[s] * self.used.seconds

    @property
    def messages(self) -> int:
        """Messages committed (as the publishers saw them)."""
        return self.stats.committed

    @property
    def transactions(self) -> float:
        """Store transactions the workers committed (one a pull)."""
        return self.used.metrics.get("slurm_gpu_ingest_write_seconds_count", 0.0)

    def per(self, stage: str, unit: str) -> float:
        """Microseconds of the stage's net CPU per message, row or transaction."""
        count = {
            "msg": self.messages,
            "row": self.stats.rows,
            "tx": self.transactions,
        }[unit]
        cpu = self.net["pgB"] + self.net["pgS"] if stage == "pg" else self.net[stage]
        return cpu / count * 1e6 if count else math.nan

    def errors(self) -> int:
        """Messages not committed within the step (RetryLater, errors, abandoned)."""
        return sum(self.stats.failed.values()) + self.stats.abandoned


def main(argv: list[str]) -> int:
    """Runs the NATS mode; 0 when it ran (the last line says ok or short)."""
    parser = argparse.ArgumentParser(
        prog="bench/scale/run --transport nats", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--nodes", type=int, default=12_500, help="production's nodes")
    parser.add_argument(
        "--rates",
        default="0.1,0.2,0.4",
        help="offered multiples of production (default %(default)s)",
    )
    parser.add_argument(
        "--shapes",
        default="1,6",
        help="ticks per message: 1 = [node] ship_interval 0, 6 = 60 s (default %(default)s)",
    )
    parser.add_argument("--hold", type=float, default=75.0, help="seconds per step")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle step")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds, unmeasured")
    parser.add_argument("--workers", type=int, default=2, help="ingest worker processes")
    parser.add_argument("--fetch-batches", type=int, default=None, help="[nats] fetch_batches")
    parser.add_argument("--publishers", type=int, default=2, help="publisher processes")
    parser.add_argument(
        "--connections", type=int, default=4, help="NATS connections per publisher process"
    )
    parser.add_argument(
        "--threads", type=int, default=64, help="ship_batch threads per publisher process"
    )
    parser.add_argument("--change", type=float, default=0.2, help="as in collector mode")
    parser.add_argument("--pg-url", default=None, help="use this PostgreSQL server")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the workers under cProfile, every thread (profiled.py; slows them down):"
        " ingest<N>.prof.txt in the kept work folder",
    )
    args = parser.parse_args(argv)
    args.keep = args.keep or args.profile
    rates = [float(r) for r in args.rates.split(",")]
    shapes = [int(t) for t in args.shapes.split(",")]
    heartbeat = heartbeat_mode()
    rows_1x, batches_1x = required_rates(args.nodes, heartbeat, args.change)

    signal.signal(signal.SIGTERM, _interrupted)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-nats-"))
    work.chmod(0o755)
    with ExitStack() as stack:
        if not args.keep:
            stack.callback(lambda: subprocess.run(["rm", "-rf", str(work)], check=False))
        else:
            print(f"scale-nats: work folder {work}")
        t0 = time.monotonic()
        if args.pg_url:
            store_url, admin, database = use_existing_pg(stack, args.pg_url)
            pg_pid = None
        else:
            store_url, admin = start_postgres(stack, work)
            database = "slurm_gpu"
            pg_pid = int((work / "pgdata" / "postmaster.pid").read_text().split()[0])
            with psycopg.connect(admin, autocommit=True) as conn:  # WAL fsync time, ours only
                conn.execute("ALTER SYSTEM SET track_wal_io_timing = on")
                conn.execute("SELECT pg_reload_conf()")
        slurm_gpu = [str(VENV / "bin" / "python"), "-m", "slurm_gpu.cli.main"]
        subprocess.run(
            [*slurm_gpu, "db", "upgrade", "--url", store_url],
            cwd=work,
            check=True,
            stdout=subprocess.DEVNULL,
        )

        # nats-server: JetStream on a free loopback port, its monitoring port, no auth.
        port, monitor_port = free_port(), free_port()
        (work / "jetstream").mkdir()
        conf = work / "nats-server.conf"
        conf.write_text(
            f"listen: 127.0.0.1:{port}\n"
            f"http: 127.0.0.1:{monitor_port}\n"
            f'jetstream {{ store_dir: "{work / "jetstream"}" }}\n'
        )
        nats_log = stack.enter_context(open(work / "nats-server.log", "wb"))
        natsd = subprocess.Popen(
            [NATS_SERVER, "-c", str(conf)], stdout=nats_log, stderr=subprocess.STDOUT
        )
        stack.enter_context(started("nats-server", natsd))
        monitor = f"http://127.0.0.1:{monitor_port}"
        wait_for("nats-server", lambda: jsz(monitor) is not None, 20, natsd)
        url = f"nats://127.0.0.1:{port}"

        # The workers: the product's `slurm-gpu ingest run`, one process each.
        config = work / "ingest.toml"
        lines = [
            "[cluster]",
            f"name = {json.dumps(CLUSTER)}",
            "[store]",
            f"url = {json.dumps(store_url)}",
            "[logging]",
            'level = "WARNING"',
            "[nats]",
            f"url = {json.dumps(url)}",
            *([f"fetch_batches = {args.fetch_batches}"] if args.fetch_batches else []),
        ]
        config.write_text("\n".join(lines) + "\n")
        from slurm_gpu.config import read_config

        settings = read_config(config)
        fetch = settings.nats.fetch_batches
        pool_per_worker = 2 if settings.node.write_admin_comment else 1
        workers: list[subprocess.Popen[bytes]] = []
        metrics_urls: list[str] = []
        for n in range(args.workers):
            mport = free_port()
            log = stack.enter_context(open(work / f"ingest{n}.log", "wb"))
            profiled = [
                str(VENV / "bin" / "python"),
                str(Path(__file__).with_name("profiled.py")),
                str(work / f"ingest{n}.prof"),
            ]
            proc = subprocess.Popen(
                [
                    *(profiled if args.profile else slurm_gpu),
                    "--config",
                    str(config),
                    "ingest",
                    "run",
                    "--metrics-listen",
                    f"127.0.0.1:{mport}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=work,
            )
            stack.enter_context(started(f"ingest worker {n}", proc))
            workers.append(proc)
            metrics_urls.append(f"http://127.0.0.1:{mport}/metrics")
            wait_for(f"ingest worker {n}", partial(answers, metrics_urls[-1]), 60, proc)
            # The first one makes the stream and the bucket; the others find them.
            wait_for("the stream", lambda: STREAM in streams(monitor), 30, proc)

        origin = math.floor(time.time() / 60) * 60 - 86400.0
        pipes: list[Connection] = []
        procs: list[BaseProcess] = []
        ctx = mp.get_context("fork")
        for c in range(args.publishers):
            mine, theirs = ctx.Pipe()
            numbers = list(range(c, args.nodes, args.publishers))
            proc_p = ctx.Process(
                target=serve,
                args=(
                    theirs,
                    url,
                    CLUSTER,
                    numbers,
                    origin,
                    heartbeat,
                    args.change,
                    args.connections,
                    args.threads,
                ),
                daemon=True,
            )
            proc_p.start()
            stack.callback(_end_process, proc_p)
            pipes.append(mine)
            procs.append(proc_p)
        stages = Stages(
            [p.pid for p in procs if p.pid is not None],
            natsd.pid,
            [w.pid for w in workers],
            pg_pid,
            database,
            metrics_urls,
            admin,
            monitor,
        )
        stack.callback(stages.close)
        sampler = Sampler(admin, database)
        sampler.start()
        stack.callback(sampler.stop.set)
        setup = time.monotonic() - t0

        cadence = (
            f"a heartbeat a tick, activity on change ({args.change:g} of GPU-ticks) or every 300s"
            if heartbeat
            else "activity every tick"
        )
        print(
            f"scale-nats: {args.nodes} nodes x 8 GPUs; nats-server {nats_version()} with"
            f" JetStream (file storage, 1 replica, no authorization) on 127.0.0.1; {args.workers}"
            f" ingest worker process(es) ([nats] fetch_batches {fetch}, {pool_per_worker} store"
            f" connection each); PostgreSQL {'at --pg-url' if args.pg_url else 'of its own'};"
            f" setup {setup:.1f}s"
        )
        print(
            f"scale-nats: {args.publishers} publisher process(es), each {args.connections} NATS"
            f" connection(s) shared by its nodes and {args.threads} threads running the"
            " product's NatsSink.ship_batch (publish, then poll the committed bucket); every"
            " node its own subject, committed key and message-id token"
        )
        print(f"scale-nats: code: {code_version(None)}")
        if pg_pid is None:
            print(
                "scale-nats: PostgreSQL at --pg-url is not this bench's: its CPU is not"
                " measured (pgB, pgS and pg read 0)"
            )
        print(
            f"scale-nats: production ({cadence}, [node] interval {INTERVAL:g}s): {rows_1x:,.0f}"
            f" rows/s in {batches_1x:,.0f} batches/s; rates {args.rates}x, ticks per message"
            f" {args.shapes} (the spool replaces a heartbeat and a GPU's activity row queued"
            " again: more ticks a message, fewer rows a tick)"
        )

        def run_step(multiple: float, ticks: int, seconds: float) -> tuple[PubStats, Used, int]:
            settle(monitor)
            before = stages.snapshot()
            sampler.reset()
            start_at = time.time() + 0.5
            for p in pipes:
                p.send(("step", multiple, ticks, start_at, seconds))
            stats = merge(p.recv() for p in pipes)
            settle(monitor)
            used = Used.between(before, stages.snapshot())
            return stats, used, sampler.reset()

        if args.warmup > 0:  # connections, the bucket's lookup, the first of everything
            run_step(rates[0], shapes[0], args.warmup)
        before = stages.snapshot()
        time.sleep(args.idle)
        quiet = Used.between(before, stages.snapshot())
        idle = {s: quiet.cpu[s] / quiet.seconds for s in STAGES}
        print(
            f"scale-nats: idle over {quiet.seconds:.0f}s, cores: "
            + " ".join(f"{s} {idle[s]:.3f}" for s in STAGES)
            + " (subtracted from every step: the per-unit figures are net of it)"
        )
        print(
            f"{'tk':>2} {'x':>5} {'s':>4} {'msg/s':>6} {'rows/s':>6} {'r/msg':>5} {'KB/msg':>6}"
            f" {'tx/s':>5} {'m/tx':>5} {'txms':>5} {'ack50':>5} {'p50ms':>6} {'p99ms':>7}"
            f" {'lag99':>6} {'polls':>5} {'busy':>4} {'err':>4} {'conns':>5} {'nats in/m':>9}"
            f" {'machine':>7}"
        )
        steps: list[Step] = []
        for ticks in shapes:
            for multiple in rates:
                stats, used, conns = run_step(multiple, ticks, args.hold)
                step = Step(ticks, multiple, stats, used, idle, conns)
                steps.append(step)
                s = used.seconds
                kb = stats.body_bytes / stats.sized / 1024 if stats.sized else math.nan
                tx = step.transactions
                write = used.metrics.get("slurm_gpu_ingest_write_seconds_sum", 0.0)
                print(
                    f"{ticks:>2} {multiple:>5g} {s:>4.0f} {stats.committed / s:>6.1f}"
                    f" {stats.rows / s:>6.0f} {stats.rows / max(1, stats.committed):>5.1f}"
                    f" {kb:>6.1f} {tx / s:>5.1f} {stats.committed / tx if tx else math.nan:>5.1f}"
                    f" {write / tx * 1000 if tx else math.nan:>5.1f}"
                    f" {percentile(stats.acks, 0.5) * 1000:>5.1f}"
                    f" {percentile(stats.latencies, 0.5) * 1000:>6.1f}"
                    f" {percentile(stats.latencies, 0.99) * 1000:>7.1f}"
                    f" {percentile(stats.lags, 0.99) * 1000:>6.1f}"
                    f" {stats.polls / max(1, stats.committed):>5.2f} {stats.busy:>4}"
                    f" {step.errors():>4} {conns:>3}/{args.workers * pool_per_worker:<2}"
                    f" {used.varz.get('in_msgs', math.nan) / max(1, stats.committed):>9.2f}"
                    f" {used.machine / s:>7.2f}",
                    flush=True,
                )
                if stats.failed:
                    print(f"scale-nats:   not committed: {dict(stats.failed)}")
                m = used.metrics
                counted = (
                    round(m.get("slurm_gpu_ingest_batches_total", 0.0)),
                    round(m.get("slurm_gpu_ingest_rows_total", 0.0)),
                )
                refused = m.get("slurm_gpu_ingest_refused_total", 0.0)
                failures = m.get("slurm_gpu_ingest_store_failures_total", 0.0)
                if counted != (stats.committed, stats.rows) or refused or failures:
                    print(
                        f"scale-nats:   the workers committed {counted[0]} batches, {counted[1]}"
                        f" rows (the publishers saw {stats.committed}, {stats.rows}); refused"
                        f" {refused:g}, store failures {failures:g}"
                    )
        print(
            "scale-nats: s = the step's seconds, from its start until the stream was empty;"
            " msg/s, rows/s = committed as the publishers saw it; tx = store transactions"
            " (the workers' slurm_gpu_ingest_write_seconds_count); p50/p99 = ship_batch,"
            " publish to committed as the agent sees it (its polls of the bucket included);"
            " txms = a store transaction's mean time in the workers (write_seconds);"
            " ack50 = median publish to JetStream's ack (ms);"
            " lag99 = how late a message started against its schedule; polls = reads of the"
            " committed bucket a message; busy = events whose node still had one in flight;"
            " conns = most store connections (pg_stat_activity) / the workers' pools;"
            " nats in/m = messages nats-server took in (/varz in_msgs: publishes, bucket"
            " reads and updates, pulls, acks) per batch message; machine = cores busy on this"
            f" machine ({os.cpu_count()} cores), every process"
        )
        for p in pipes:
            p.send(("stop",))
        report_cost(steps, args.nodes, fetch)
        return verdict(steps, idle, args.nodes, shapes, rates)
    return 0


def nats_version() -> str:
    """nats-server's version."""
    try:
        out = subprocess.run([NATS_SERVER, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    return out.strip().rsplit(" ", 1)[-1].lstrip("v") or "?"


def report_cost(steps: list[Step], nodes: int, fetch: int) -> None:
    """The per-unit table: each stage's net CPU per message, row and transaction."""
    print(
        f"{'tk':>2} {'x':>5} | {'cores: pub':>10} {'nats':>5} {'wrk':>5} {'pgB':>5} {'pgS':>5}"
        f" | {'us/msg: pub':>11} {'nats':>5} {'wrk':>5} {'pg':>5} | {'us/row: nats':>12}"
        f" {'wrk':>4} {'pg':>4} | {'us/tx: wrk':>10} {'pg':>6} | {'WAL B/row':>9}"
        f" {'fsync/tx':>8} {'nats us/op':>10}"
    )
    for st in steps:
        s = st.used.seconds
        wal = st.used.wal
        walrow = wal.get("bytes", math.nan) / st.stats.rows if st.stats.rows else math.nan
        sync = wal.get("sync", math.nan) / st.transactions if st.transactions else math.nan
        ops = st.used.varz.get("in_msgs", 0.0)
        op = st.net["nats"] / ops * 1e6 if ops else math.nan
        print(
            f"{st.ticks:>2} {st.multiple:>5g} | {st.used.cpu['pub'] / s:>10.3f}"
            f" {st.used.cpu['nats'] / s:>5.3f} {st.used.cpu['wrk'] / s:>5.3f}"
            f" {st.used.cpu['pgB'] / s:>5.3f} {st.used.cpu['pgS'] / s:>5.3f}"
            f" | {st.per('pub', 'msg'):>11.0f} {st.per('nats', 'msg'):>5.0f}"
            f" {st.per('wrk', 'msg'):>5.0f} {st.per('pg', 'msg'):>5.0f}"
            f" | {st.per('nats', 'row'):>12.1f} {st.per('wrk', 'row'):>4.0f}"
            f" {st.per('pg', 'row'):>4.0f} | {st.per('wrk', 'tx'):>10.0f}"
            f" {st.per('pg', 'tx'):>6.0f} | {walrow:>9.0f} {sync:>8.2f} {op:>10.1f}"
        )
    print(
        "scale-nats: cores = each stage's CPU over the step (gross: utime+stime from"
        " /proc/<pid>/stat, threads included; pgB = the store's backends, pgS = the"
        " postmaster, walwriter, checkpointer, autovacuum ...); us/msg, us/row, us/tx ="
        " microseconds of the stage's CPU net of its idle use, per message committed, per"
        f" row, per store transaction (a worker's pull, at most [nats] fetch_batches {fetch}"
        " messages); WAL B/row, fsync/tx: pg_stat_wal; nats us/op: nats-server's net CPU"
        " per message it took in"
    )


def verdict(
    steps: list[Step], idle: dict[str, float], nodes: int, shapes: list[int], rates: list[float]
) -> int:
    """Flatness over the rates, cores at 10x, serial shares; the last line."""
    at10: dict[int, dict[str, float]] = {}
    for ticks in shapes:
        mine = [s for s in steps if s.ticks == ticks]
        if not mine:
            continue
        msgs10 = 10 * nodes / INTERVAL / ticks  # messages/s at 10x production
        rows_msg = sum(s.stats.rows for s in mine) / max(1, sum(s.messages for s in mine))
        at10[ticks] = {"msgs": msgs10}
        print(
            f"scale-nats: {ticks} tick(s) a message: 10x production is {msgs10:,.0f} messages/s,"
            f" {msgs10 * rows_msg:,.0f} rows/s"
        )
        for stage in ("pub", "nats", "wrk", "pg"):
            per = [s.per(stage, "msg") for s in mine]
            lo, hi = min(per), max(per)
            spread = (hi - lo) / lo if lo > 0 else math.inf
            if spread <= FLAT:
                shape = f"flat ({spread:+.0%} spread)"
            elif per[-1] == hi:
                shape = (
                    f"NOT FLAT: {spread:.0%} spread, highest at {mine[-1].multiple:g}x (contention)"
                )
            else:
                shape = (
                    f"NOT FLAT: {spread:.0%} spread, falls with the rate (fixed costs or"
                    " batching, not contention)"
                )
            idle_cores = idle["pgB"] + idle["pgS"] if stage == "pg" else idle[stage]
            # Conservative: the costliest rate's us/msg (per[-1] is the highest rate's).
            cores = idle_cores + hi * 1e-6 * msgs10
            at_top = idle_cores + per[-1] * 1e-6 * msgs10
            at10[ticks][stage] = cores
            per_text = " ".join(f"{p:,.0f}" for p in per)
            at = "/".join(f"{r:g}" for r in rates)
            print(
                f"scale-nats:   {stage:>4}: us/msg {per_text} at {at}x: {shape}; at 10x"
                f" {cores:.2f} cores (idle {idle_cores:.2f} + the costliest us/msg x"
                f" messages/s; {at_top:.2f} at the {rates[-1]:g}x cost)"
            )
        serial(mine[-1], at10[ticks])
    default = shapes[0]
    for ticks in shapes[1:]:
        c = at10[ticks]
        print(
            f"scale-nats: at {ticks} ticks a message: workers={c['wrk']:.2f} nats={c['nats']:.2f}"
            f" goal workers<={GOAL_WORKERS:g} nats<={GOAL_NATS:g}"
            f" {'ok' if c['wrk'] <= GOAL_WORKERS and c['nats'] <= GOAL_NATS else 'short'}"
        )
    c = at10[default]
    ok = c["wrk"] <= GOAL_WORKERS and c["nats"] <= GOAL_NATS
    print(
        f"scale-nats: workers={c['wrk']:.2f} nats={c['nats']:.2f} goal workers<={GOAL_WORKERS:g}"
        f" nats<={GOAL_NATS:g} {'ok' if ok else 'short'}"
    )
    return 0


def serial(step: Step, at10: dict[str, float]) -> None:
    """What of each stage is one thread, process or lock, at the step's rate and at 10x."""
    scale = 10.0 / step.multiple
    s = step.used.seconds
    used = step.used
    msgs = max(1, step.messages)

    def busiest(stage: str) -> tuple[str, float, float]:
        parts = used.parts[stage]
        if stage == "pgS":
            parts = {**parts, **{f"backend:{k}": v for k, v in used.parts["pgB"].items()}}
        if not parts:
            return "-", math.nan, math.nan
        name, cpu = max(parts.items(), key=lambda kv: kv[1])
        total = sum(parts.values())
        return name, cpu / s, cpu / total if total else math.nan

    at = f"at {step.multiple:g}x"
    name, cores, share = busiest("nats")
    appends = {k[4:]: v for k, v in used.varz.items() if k.startswith("seq:")}
    streams_text = ", ".join(
        f"{n} {v / msgs:.2f}/msg ({v / msgs * at10['msgs']:,.0f}/s at 10x)"
        for n, v in sorted(appends.items())
    )
    print(
        f"scale-nats:   serial nats: busiest OS thread {name} {cores:.3f} cores {at}"
        f" ({share:.0%} of nats-server's CPU; Go moves goroutines between threads, so"
        f" this is no hard limit); appends to each stream, whose writes one lock"
        f" serializes: {streams_text}"
    )
    workers = len({k.split(":")[0] for k in used.parts["wrk"]})
    name, cores, share = busiest("wrk")
    per_worker = used.cpu["wrk"] / s / max(1, workers)
    m = used.metrics
    count = m.get("slurm_gpu_ingest_write_seconds_count", 0.0)
    write = m.get("slurm_gpu_ingest_write_seconds_sum", 0.0)
    print(
        f"scale-nats:   serial wrk: {per_worker:.3f} cores a worker {at} (busiest thread"
        f" {name}, {share:.0%} of the workers' CPU); the store transaction"
        f" {write / count * 1000 if count else math.nan:.1f} ms a pull,"
        f" {write / s / max(1, workers):.1%} of each worker's time; nothing is shared"
        " between workers but nats-server's one consumer; one worker is one Python process"
        f" (its GIL: at most 1 core), so 10x needs at least {math.ceil(at10['wrk'])} of them"
    )
    name, cores, share = busiest("pgS")
    wal = used.wal
    flush = ""
    if "sync_ms" in wal and wal.get("sync"):
        busy = wal["sync_ms"] / 1000 / s
        flush = (
            f"; WAL flushes (one WAL: serial) {wal['sync'] / s:.1f}/s, busy {busy:.1%} of"
            f" the time {at}, {busy * scale:.0%} at 10x if they grow with the load (group"
            " commit shares a flush between transactions)"
        )
    print(
        f"scale-nats:   serial pg: busiest process {name} {cores:.3f} cores {at}"
        f" ({share:.0%} of PostgreSQL's CPU; a backend is one worker's connection){flush}"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
