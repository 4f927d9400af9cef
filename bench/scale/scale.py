"""bench/scale: 12,500 simulated nodes x 8 GPUs shipping into one collector and PostgreSQL.

Starts its own munged (own key, own socket), PostgreSQL (initdb into a temp dir as user
postgres, a free loopback port), upgrades a store there, runs `slurm-gpu collector run`
with its own config, and drives the simulated agents from client processes at increasing
multiples of the production cadence until the collector no longer keeps up. Everything it
started is stopped by pid at the end, on an error or Ctrl-C too. See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psycopg
from client import StepStats, percentile, serve
from load import INTERVAL, TICKS_PER_PERIOD, check_templates, heartbeat_mode, node_name
from load import rows_per_second as required_rates
from seed import CLUSTER

from slurm_gpu.collector.credential import decode_rows
from slurm_gpu.collector.wire import decode_batch

VENV = Path(os.environ.get("SLURM_GPU_VENV", "/opt/slurm-gpu/venv"))
PG_BIN = Path(os.environ.get("SLURM_GPU_PG_BIN", "/usr/lib/postgresql/15/bin"))
GOAL = 10.0
HOLD_SHARE = 0.97  # a step holds when this share of its rows was accepted in it, and ...


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    what: str, ready: Callable[[], object], seconds: float, proc: subprocess.Popen[bytes] | None
) -> None:
    """Waits until `ready()` is true (exceptions: not yet); raises if `proc` exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        try:
            if ready():
                return
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not come up in {seconds:.0f}s")


@contextmanager
def started(
    what: str, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM
) -> Iterator[subprocess.Popen[bytes]]:
    """Stops `proc` (by its pid) when the block ends, however it ends."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, sig)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print(f"scale: {what} (pid {proc.pid}) did not stop; killing it", file=sys.stderr)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()


def _connects(url: str) -> bool:
    psycopg.connect(url, connect_timeout=2).close()
    return True


def as_user(user: str) -> dict[str, Any]:
    """Popen's arguments that run a command as `user` (and its group only)."""
    return {"user": user, "group": user, "extra_groups": []}


def munge_ceiling(socket: str, seconds: int = 5) -> float:
    """Credentials/s this machine's munged encodes and decodes, with every core on it.

    `remunge -d` (MUNGE's own benchmark, C, 8 threads) over a 64-byte payload, the hex
    SHA-256 digest a batch carries: each batch costs one encode (on its node) and one
    decode (in the collector), so this over the required batches/s is the most any
    collector could hold on this machine before its HTTP, Python and the store run.
    nan when remunge is missing or munged does not answer.
    """
    try:
        done = subprocess.run(
            ["remunge", "-q", "-d", "-T", "8", "-l", "64", "-D", str(seconds), "-S", socket],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=True,
        )
        rate = float(done.stdout.split()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return math.nan
    return rate if rate > 0 else math.nan  # remunge -q says 0 when munged did not answer


def start_munged(stack: ExitStack, work: Path, threads: int) -> tuple[str, int]:
    """munged with a fresh key on a socket of its own; returns (its socket, its pid)."""
    home = work / "munge"
    home.mkdir()
    subprocess.run(["chown", "munge:munge", str(home)], check=True)
    home.chmod(0o755)  # munged wants the socket's folder open to all
    subprocess.run(
        ["mungekey", "-c", "-k", str(home / "munge.key"), "-b", "1024"],
        check=True,
        **as_user("munge"),
    )
    sock = home / "munge.sock"
    log = stack.enter_context(open(work / "munged.out", "wb"))  # noqa: SIM115 (the stack closes it)
    proc = subprocess.Popen(
        [
            "munged",
            "-F",
            f"--socket={sock}",
            f"--key-file={home / 'munge.key'}",
            f"--pid-file={home / 'munged.pid'}",
            f"--log-file={home / 'munged.log'}",
            f"--seed-file={home / 'munged.seed'}",
            f"--num-threads={threads}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        **as_user("munge"),
    )
    stack.enter_context(started("munged", proc))
    wait_for("munged", sock.exists, 20, proc)
    return str(sock), proc.pid


def start_postgres(stack: ExitStack, work: Path) -> tuple[str, str]:
    """A PostgreSQL of its own; returns (store URL, superuser URL for psycopg)."""
    data, run = work / "pgdata", work / "pg-run"
    for d in (data, run):
        d.mkdir()
        subprocess.run(["chown", "postgres:postgres", str(d)], check=True)
    data.chmod(0o700)
    password = secrets.token_hex(12)
    pwfile = work / "pg.pw"
    pwfile.write_text(password + "\n")
    subprocess.run(["chown", "postgres", str(pwfile)], check=True)
    subprocess.run(
        [
            str(PG_BIN / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-locale",
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        **as_user("postgres"),
    )
    port = free_port()
    log = stack.enter_context(open(work / "postgres.out", "wb"))  # noqa: SIM115 (the stack closes it)
    proc = subprocess.Popen(
        [
            str(PG_BIN / "postgres"),
            "-D",
            str(data),
            "-k",
            str(run),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        **as_user("postgres"),
    )
    # SIGINT: PostgreSQL's fast shutdown
    stack.enter_context(started("postgres", proc, signal.SIGINT))
    admin = f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"
    wait_for("postgres", lambda: _connects(admin), 60, proc)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE slurm_gpu")
    store = f"postgresql+psycopg://postgres:{password}@127.0.0.1:{port}/slurm_gpu"
    return store, admin


def use_existing_pg(stack: ExitStack, url: str) -> tuple[str, str, str]:
    """A fresh database slurm_gpu_test_scale_<pid> on an existing server (dropped after)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = f"slurm_gpu_test_scale_{os.getpid()}"
    admin = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    stack.callback(drop)
    store = parsed.set(database=name).render_as_string(hide_password=False)
    return store, admin, name


def collector_config(
    path: Path,
    store: str,
    listen: str,
    munge_socket: str,
    nodes: int,
    pool_size: int,
    queue_depth: int,
    processes: int = 1,
) -> None:
    """The collector's config: every simulated node's credentials come from munged's address."""
    lines = [
        "[cluster]",
        f"name = {json.dumps(CLUSTER)}",
        "",
        "[store]",
        f"url = {json.dumps(store)}",
        "",
        "[logging]",
        'level = "WARNING"',
        "",
        "[collector]",
        f"listen = {json.dumps(listen)}",
        f"pool_size = {pool_size}",
        f"queue_depth = {queue_depth}",
        # Only when asked: a --source tree before [collector] processes refuses the key.
        *([f"processes = {processes}"] if processes != 1 else []),
        f"munge_socket = {json.dumps(munge_socket)}",
        "",
        "[collector.nodes]",
    ]
    # One munged gives one origin address (127.0.0.1 here): every node maps to it.
    lines += [f'{node_name(n)} = ["127.0.0.1"]' for n in range(nodes)]
    path.write_text("\n".join(lines) + "\n")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, or 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Cpu:
    """CPU seconds used by what the bench started (NaN: not started by it)."""

    collector: float
    postgres: float
    munged: float

    @classmethod
    def now(cls, collector: int, postgres: int | None, munged: int) -> Cpu:
        """Their CPU seconds so far."""
        return cls(
            children_cpu(collector),  # and its workers ([collector] processes)
            children_cpu(postgres) if postgres else math.nan,
            cpu_seconds(munged) if munged else math.nan,
        )

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(
            self.collector - other.collector,
            self.postgres - other.postgres,
            self.munged - other.munged,
        )


def children_cpu(parent: int) -> float:
    """CPU of `parent`, its live children (PostgreSQL's backends) and those that ended."""
    total = cpu_seconds(parent)
    try:  # cutime + cstime: the children it waited for (backends of closed connections)
        fields = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == parent:
                total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Sampler(threading.Thread):
    """Samples the store's connections (pg_stat_activity) and the collector's queue."""

    def __init__(self, admin: str, database: str, metrics_url: str) -> None:
        super().__init__(daemon=True)
        self.admin, self.database, self.metrics_url = admin, database, metrics_url
        self.max_connections = 0
        self.max_queue = 0.0
        self.stop = threading.Event()

    def reset(self) -> tuple[int, float]:
        """The most connections and queue depth seen since the last reset."""
        seen = self.max_connections, self.max_queue
        self.max_connections, self.max_queue = 0, 0.0
        return seen

    def run(self) -> None:
        """Samples every 0.25 s until `stop` is set."""
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self.stop.wait(0.25):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = %s AND backend_type = 'client backend'",
                    (self.database,),
                ).fetchone()
                self.max_connections = max(self.max_connections, int(row[0]) if row else 0)
                try:
                    with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                        for line in r.read().decode().splitlines():
                            if line.startswith("slurm_gpu_collector_queue_depth "):
                                self.max_queue = max(self.max_queue, float(line.split()[1]))
                except OSError:
                    pass


def _end_process(proc: BaseProcess) -> None:
    """Ends a client process (by its pid) and waits for it."""
    proc.terminate()
    proc.join(10)


def merge(stats: list[StepStats]) -> StepStats:
    """The client processes' figures of one step, summed."""
    out = StepStats()
    for s in stats:
        out.due += s.due
        out.fresh_rows += s.fresh_rows
        out.ok += s.ok
        out.ok_rows += s.ok_rows
        out.late_ok_rows += s.late_ok_rows
        out.statuses += s.statuses
        out.latencies += s.latencies
        out.lags += s.lags
        out.pending_rows += s.pending_rows
        out.cpu_seconds += s.cpu_seconds
    return out


def seed_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with bench/scale on the path too (seed.py imports load.py)."""
    here = str(Path(__file__).resolve().parent)
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{path}:{here}" if path else here}


def code_version(source: str | None) -> str:
    """Which code runs: the commit of this checkout (and whether it has changes), or --source."""
    if source:
        return f"collector from {source}; clients from this checkout"
    here = Path(__file__).resolve().parent

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(here), *a], capture_output=True, text=True
        ).stdout.strip()

    dirty = (
        " with uncommitted changes" if git("status", "--porcelain", "--", "../../slurm_gpu") else ""
    )
    return f"{git('log', '-1', '--format=%h %s')[:90]}{dirty}"


def settle(metrics_url: str, most: float = 30.0) -> None:
    """Waits (up to `most` s) until the collector stops taking batches.

    So the step before's backlog (requests its clients gave up on still reach the writers)
    is written before the next step starts.
    """
    deadline = time.monotonic() + most
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(metrics_url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return
        now = [ln for ln in text.splitlines() if ln.startswith("slurm_gpu_collector_batches_total")]
        if now == last:
            return
        last = now
        time.sleep(1.0)


def step_seconds(multiple: float, hold: float, aligned: bool = False) -> tuple[float, bool]:
    """(seconds, whole): the step's length, at least `hold`.

    In whole ticks: load.py staggers the nodes' periods, so any whole ticks carry their share
    of interval rows. With `aligned` periods (as real agents', all sealing in one tick) in
    whole sealing cycles where a cycle is not much longer than `hold`, else whole ticks.
    """
    tick = INTERVAL / multiple
    if not aligned:  # staggered seals: any whole ticks hold the right share of rows
        return math.ceil(hold / tick) * tick, True
    cycle = INTERVAL * TICKS_PER_PERIOD / multiple
    if cycle <= 1.5 * hold:
        return math.ceil(hold / cycle) * cycle, True
    return math.ceil(hold / tick) * tick, False


class Step:
    """One step's figures, and whether the collector held it."""

    def __init__(
        self,
        multiple: float,
        seconds: float,
        whole: bool,
        stats: StepStats,
        rows_1x: float,
        used: Cpu,
    ) -> None:
        self.multiple, self.seconds, self.whole, self.stats = multiple, seconds, whole, stats
        self.used = used  # the CPU of what the bench started, over the step
        self.rate = stats.ok_rows / seconds
        self.offered = stats.fresh_rows / seconds
        accepted = stats.ok_rows / stats.fresh_rows if stats.fresh_rows else 0.0
        # Whole cycles: measured rows/s over required; else the multiple times the share
        # accepted (a window of part of a cycle holds the minute's rows or not).
        self.ratio = self.rate / rows_1x if whole else multiple * min(1.0, accepted)
        self.p50 = percentile(stats.latencies, 0.5)
        self.p99 = percentile(stats.latencies, 0.99)
        self.lag99 = percentile(stats.lags, 0.99)
        self.refused = stats.statuses.get("503", 0)
        self.errors = sum(v for k, v in stats.statuses.items() if k not in ("200", "503"))
        period = INTERVAL / multiple
        self.holds = (
            stats.ok_rows >= HOLD_SHARE * stats.fresh_rows
            and self.refused == 0
            and self.errors == 0
            and self.p99 <= period
            and self.lag99 <= period
        )

    def line(self, conns: int, queue: float) -> str:
        """The step's row of the table."""
        s, used = self.seconds, self.used
        ratio = f"{self.ratio:.2f}{'' if self.whole else '*'}"
        return (
            f"{self.multiple:>6g} {s:>4.0f} {self.offered:>9,.0f} {self.rate:>9,.0f} {ratio:>6}"
            f" {self.p50 * 1000:>8.1f} {self.p99 * 1000:>8.1f} {self.lag99 * 1000:>8.1f}"
            f" {self.refused:>5} {self.errors:>4} {conns:>5} {queue:>5.0f}"
            f" {used.collector / s:>5.2f} {used.postgres / s:>5.2f} {used.munged / s:>5.2f}"
            f" {self.stats.cpu_seconds / s:>5.2f} {self.collector_us():>7.0f}"
            f"  {'yes' if self.holds else 'no'}"
        )

    def collector_us(self) -> float:
        """Microseconds of the collector's CPU per batch answered 200 (nan: none was).

        What sizes a head node: one collector process takes about 1e6 / this batches/s
        per core it gets.
        """
        return self.used.collector / self.stats.ok * 1e6 if self.stats.ok else math.nan


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    """Runs the bench; 0 when a step held, 1 when none did."""
    # --transport nats: the per-unit cost model of the NATS JetStream path (scale_nats.py).
    transport = argparse.ArgumentParser(add_help=False)
    transport.add_argument("--transport", choices=("collector", "nats"), default="collector")
    known, rest = transport.parse_known_args()
    if known.transport == "nats":
        import scale_nats

        return scale_nats.main(rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--transport",
        choices=("collector", "nats"),
        default="collector",
        help="collector (default): the ladder into the HTTP collector; nats: the per-unit"
        " cost of the NATS JetStream path (README.md, NATS mode; --transport nats --help)",
    )
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument(
        "--multiples",
        default="auto",
        help="multiples of the production cadence, in order, e.g. 1,2,4,8; auto"
        " (default): a probe at 1x, then doubling from a power of two below it",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=40.0,
        help="seconds per step, rounded up to whole 60 s/multiple cycles",
    )
    parser.add_argument(
        "--lowest",
        type=float,
        default=0.125,
        help="when the first multiple fails, halve it down to this",
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=1,
        help="steps between the highest held and lowest failed multiple",
    )
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=256,
        help="most requests open at once per client (default %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="per request (the agent's)")
    parser.add_argument(
        "--new-connections",
        action="store_true",
        help="one connection per batch (the agent before keep-alive); default: one per node",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="run the collector under cProfile, every thread (profiled.py): its top"
        " functions are printed and the stats kept in the work folder (slows it down)",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="[collector] pool_size (default: the product's default)",
    )
    parser.add_argument("--queue-depth", type=int, default=None, help="[collector] queue_depth")
    parser.add_argument(
        "--processes", type=int, default=None, help="[collector] processes (default: the product's)"
    )
    parser.add_argument(
        "--pg-url",
        default=None,
        help="use this PostgreSQL server (a fresh database on it, dropped after)"
        " instead of starting one",
    )
    parser.add_argument(
        "--munge-socket", default=None, help="use this munged instead of starting one"
    )
    parser.add_argument("--munge-threads", type=int, default=4)
    parser.add_argument(
        "--change",
        type=float,
        default=0.2,
        help="ship-less code only: share of GPU-ticks whose activity changed"
        " (default %(default)s; 0 = refresh only, 1 = every tick)",
    )
    parser.add_argument(
        "--cadence",
        choices=("auto", "ship-less", "every-tick"),
        default="auto",
        help="what the agents ship: auto (default) follows this code's shipper; every-tick"
        " is activity every tick, no heartbeat (for a --source before ship-less)",
    )
    parser.add_argument(
        "--source",
        default=None,
        help="run the collector (and the store upgrade) from this source tree"
        " (e.g. `git archive` of an older commit) instead of the installed one",
    )
    parser.add_argument(
        "--seed",
        action="store_true",
        help="write every node's job (started event) and inventory into the store"
        " first, through the product's Store.write_batches",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    multiples = [] if args.multiples == "auto" else [float(m) for m in args.multiples.split(",")]

    from slurm_gpu.config.collector import CollectorSettings

    defaults = CollectorSettings()
    pool_size = args.pool_size or defaults.pool_size
    queue_depth = args.queue_depth or defaults.queue_depth
    processes = args.processes or defaults.processes
    heartbeat = heartbeat_mode() if args.cadence == "auto" else args.cadence == "ship-less"
    rows_1x, batches_1x = required_rates(args.nodes, heartbeat, args.change)
    check_templates(lambda body: decode_rows(decode_batch(body)))

    # SIGTERM ends the run like Ctrl-C: everything started is stopped on the way out.
    signal.signal(signal.SIGTERM, _interrupted)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    work.chmod(0o755)
    with ExitStack() as stack:
        if not args.keep and not args.profile:
            stack.callback(lambda: subprocess.run(["rm", "-rf", str(work)], check=False))
        else:
            print(f"scale: work folder {work}")
        if args.profile:  # written when the collector stops, after the last line
            stack.callback(lambda: print(f"scale: collector profile in {work}/collector.prof.txt"))
        t0 = time.monotonic()
        munge_socket, munged_pid = (
            (args.munge_socket, 0)
            if args.munge_socket
            else start_munged(stack, work, args.munge_threads)
        )
        if args.pg_url:
            store_url, admin, database = use_existing_pg(stack, args.pg_url)
            pg_pid = None
        else:
            store_url, admin = start_postgres(stack, work)
            database = "slurm_gpu"
            pg_pid = int((work / "pgdata" / "postmaster.pid").read_text().split()[0])
        env = dict(os.environ)
        if args.source:
            env["PYTHONPATH"] = str(Path(args.source).resolve())
        slurm_gpu = [str(VENV / "bin" / "python"), "-m", "slurm_gpu.cli.main"]
        subprocess.run(
            [*slurm_gpu, "db", "upgrade", "--url", store_url],
            env=env,
            cwd=work,  # not this checkout's folder: --source's tree comes first
            check=True,
            stdout=subprocess.DEVNULL,
        )
        origin = math.floor(time.time() / 60) * 60 - 86400.0  # yesterday, whole minutes
        seeded_at = time.monotonic()
        if args.seed:
            subprocess.run(
                [
                    str(VENV / "bin" / "python"),
                    str(Path(__file__).with_name("seed.py")),
                    store_url,
                    str(args.nodes),
                    repr(origin),
                ],
                env=seed_env(env),
                check=True,
            )
        seeded = time.monotonic() - seeded_at
        port = free_port()
        config = work / "collector.toml"
        collector_config(
            config,
            store_url,
            f"127.0.0.1:{port}",
            munge_socket,
            args.nodes,
            pool_size,
            queue_depth,
            processes,
        )
        log = stack.enter_context(open(work / "collector.log", "wb"))
        profiled = [str(VENV / "bin" / "python"), str(Path(__file__).with_name("profiled.py"))]
        profile = work / "collector.prof"
        run_collector = [*profiled, str(profile)] if args.profile else slurm_gpu
        collector = subprocess.Popen(
            [*run_collector, "--config", str(config), "collector", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=work,  # not this checkout's folder: --source's tree comes first
        )
        stack.enter_context(started("collector", collector))
        base = f"http://127.0.0.1:{port}"
        wait_for(
            "collector",
            lambda: urllib.request.urlopen(base + "/healthz", timeout=2).status == 200,
            60,
            collector,
        )
        setup = time.monotonic() - t0

        pipes: list[Connection] = []
        ctx = mp.get_context("fork")
        for c in range(args.clients):
            mine, theirs = ctx.Pipe()
            numbers = list(range(c, args.nodes, args.clients))
            proc = ctx.Process(
                target=serve,
                args=(
                    theirs,
                    "127.0.0.1",
                    port,
                    numbers,
                    origin,
                    heartbeat,
                    args.change,
                    munge_socket,
                    args.in_flight,
                    args.timeout,
                    not args.new_connections,
                ),
                daemon=True,
            )
            proc.start()
            stack.callback(_end_process, proc)
            pipes.append(mine)
        sampler = Sampler(admin, database, base + "/metrics")
        sampler.start()
        stack.callback(sampler.stop.set)

        where = "at --pg-url" if args.pg_url else "of its own"
        seeding = (
            f"seeded into the store ({seeded:.0f}s)"
            if args.seed
            else "not in the store (--seed writes them, about 9 ms a node)"
        )
        cadence = (
            f"a heartbeat a tick, activity on change ({args.change:g} of GPU-ticks) or every 300s"
            if heartbeat
            else "activity every tick"
        )
        print(
            f"scale: {args.nodes} nodes x 8 GPUs, 1 collector (processes {processes},"
            f" pool_size {pool_size}, queue_depth {queue_depth}), PostgreSQL {where},"
            f" {args.clients} client process(es); setup {setup:.1f}s"
        )
        print(
            f"scale: the nodes' jobs and inventories are {seeding};"
            " the run starts at their second tick: the steps measure the steady cadence"
        )
        print(
            "scale: one munged signs for every node, so [collector] nodes maps all "
            f"{args.nodes} names to its one origin address (127.0.0.1): the credential,"
            " digest, uid and replay checks are real, the node-to-address check is the same"
            " lookup for each"
        )
        print(f"scale: code: {code_version(args.source)}")
        ceiling = munge_ceiling(munge_socket)
        print(
            f"scale: MUNGE alone on this machine: {ceiling:,.0f} credentials/s encoded and"
            f" decoded with all {os.cpu_count()} cores (remunge -d): at most"
            f" {ceiling / batches_1x:.2f}x production's {batches_1x:,.0f} batches/s before"
            " any HTTP, Python or PostgreSQL (a cluster's nodes sign their own batches: its"
            " head node only decodes)"
        )
        print(
            f"scale: cadence of this code: {cadence}"
            f" ([node] interval {INTERVAL:g}s, one batch per node per tick): required"
            f" {rows_1x:,.0f} rows/s, {batches_1x:,.0f} batches/s"
        )

        def run_step(
            multiple: float, seconds: float, every_node: bool = False
        ) -> tuple[StepStats, Cpu, int, float]:
            settle(base + "/metrics")
            start_at = time.time() + 0.5
            before = Cpu.now(collector.pid, pg_pid, munged_pid)
            sampler.reset()
            for p in pipes:
                p.send(("step", multiple, start_at, seconds, every_node))
            stats = merge([p.recv() for p in pipes])
            conns, queue = sampler.reset()
            used = Cpu.now(collector.pid, pg_pid, munged_pid) - before
            return stats, used, conns, queue

        if args.multiples == "auto":
            # A probe at 1x for two ticks: where the ladder starts (a power of two below the
            # share of 1x's batches it took), so the run fits its few minutes.
            probe, *_ = run_step(1.0, 2 * INTERVAL)
            took = probe.ok / probe.due if probe.due else 0.0
            start = 2.0 ** math.floor(math.log2(max(took, args.lowest)))
            multiples = [start * 2**i for i in range(8)]
            print(
                f"scale: probe at 1x: {probe.ok}/{probe.due} batches answered 200 in"
                f" {2 * INTERVAL:g}s ({dict(probe.statuses)}): ladder from {start:g}x"
            )
        header = (
            f"{'x':>6} {'s':>4} {'offered/s':>9} {'rows/s':>9} {'ratio':>6} {'p50 ms':>8}"
            f" {'p99 ms':>8} {'p99 lag':>8} {'503':>5} {'err':>4} {'conns':>5}"
            f" {'queue':>5} {'coll':>5} {'pg':>5} {'munge':>5} {'cli':>5} {'coll us':>7}  holds"
        )
        print(header)
        results: dict[float, Step] = {}
        max_conns = 0

        def measure(multiple: float) -> Step:
            nonlocal max_conns
            seconds, whole = step_seconds(multiple, args.hold)
            stats, used, conns, queue = run_step(multiple, seconds)
            max_conns = max(max_conns, conns)
            step = Step(multiple, seconds, whole, stats, rows_1x, used)
            print(step.line(conns, queue), flush=True)
            results[multiple] = step
            return step

        # Up the ladder until a step does not hold; below the first one if that fails; then
        # once between the highest held and the lowest failed (--refine).
        held: float | None = None
        failed: float | None = None
        for multiple in multiples:
            if measure(multiple).holds:
                held = multiple
            else:
                failed = multiple
                break
        while held is None and failed is not None and failed / 2 >= args.lowest:
            if measure(failed / 2).holds:
                held = failed / 2
            else:
                failed = failed / 2
        for _ in range(args.refine):
            if held is None or failed is None:
                break
            middle = round((held + failed) / 2, 3)
            if middle in (held, failed):
                break
            if measure(middle).holds:
                held = middle
            else:
                failed = middle
        for p in pipes:
            p.send(("stop",))
        with psycopg.connect(admin.rsplit("/", 1)[0] + "/" + database) as conn:
            counts = {
                t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                for t in ("gpu_intervals", "gpu_physical_intervals", "job_events")
            }
        print(f"scale: in the store: {counts}")
        print(
            "scale: columns: offered and rows/s = rows the step's ticks made and rows of"
            " batches answered 200 within it; ratio = rows/s over the required (* : the"
            " step is not whole 60s cycles, ratio = multiple x share accepted); p50/p99 ="
            " ship latency (sign + POST + answer); lag = how late the clients sent;"
            " conns = most client connections to the bench's database (pg_stat_activity);"
            " queue = most batches waiting for a writer; coll, pg, munge, cli = cores used by"
            " the collector, PostgreSQL, munged, the clients; coll us = microseconds of the"
            " collector's CPU per batch answered 200"
        )
        print(
            f"scale: connections to the store: max {max_conns} over the run,"
            f" pool_size {pool_size}: ratio={max_conns / pool_size:.2f} goal<=1"
            f" {'ok' if max_conns <= pool_size else 'over'}"
        )
        if held is None:
            print(f"scale: the collector held no step down to {args.lowest:g}x production")
            print(f"scale: ratio=0.00 goal={GOAL:g} short")
            return 1
        best = results[held]
        stats = best.stats
        print(
            f"scale: held {held:g}x production for {best.seconds:.0f}s: {best.rate:,.0f}"
            f" rows/s ({stats.ok / best.seconds:,.0f} batches/s) against {rows_1x:,.0f}"
            f" required; p50 {best.p50 * 1000:.1f} ms, p99 {best.p99 * 1000:.1f} ms;"
            f" 503s {best.refused}; the collector's CPU {best.collector_us():,.0f} us"
            " a batch"
            + (f"; failed at {failed:g}x" if failed else "")
            + (
                ""
                if best.whole
                else " (the step is part of a 60 s cycle: its rows/s may miss the minute's"
                " interval rows, so the ratio is the multiple x the share accepted)"
            )
        )
        print(
            f"scale: ratio={best.ratio:.2f} goal={GOAL:g} {'ok' if best.ratio >= GOAL else 'short'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
