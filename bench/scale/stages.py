"""CPU per batch of each stage of the collector's request path, one thread, no HTTP.

Usage: PYTHONPATH=. python bench/scale/stages.py [BATCHES] [--pg-url URL] [--group N]

Bench batches (load.py, the production cadence's rows) through the collector's own code:
`decode_batch`, the credential check with this machine's munged (its default socket; the
process must be root for a uid-0 credential, else `non_root` is reported and the decode
still timed), `decode_rows` (the agent's decoders) and the digest; with `--pg-url`, the
store's write too (`Store.write_batches` in groups of `--group` batches, 4 by default,
into a fresh database on that server, dropped after: compare 1 and 32 for what group
commit saves): the CPU of this process only, PostgreSQL's is
its own. Prints microseconds of CPU per batch and per row.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from load import SimNode, body_of, tick_rows

from slurm_gpu.collector.credential import CredentialCheck, decode_rows
from slurm_gpu.collector.wire import Refusal, decode_batch, digest
from slurm_gpu.munge import Libmunge
from slurm_gpu.node.shipper import DecodedBatch

GROUP = 4  # batches per transaction by default (--group)


def cpu(what: Callable[[], object], times: int) -> float:
    """CPU seconds of `times` calls of `what`, per call."""
    started = time.process_time()
    for _ in range(times):
        what()
    return (time.process_time() - started) / times


def main() -> None:
    """Times each stage over the same bench batches and prints the table."""
    args = sys.argv[1:]
    pg_url, group = None, GROUP
    if "--group" in args:
        at = args.index("--group")
        group = int(args[at + 1])
        del args[at : at + 2]
    if "--pg-url" in args:
        at = args.index("--pg-url")
        pg_url = args[at + 1]
        del args[at : at + 2]
    count = int(args[0]) if args else 2000
    nodes = [SimNode(number=n, origin=1.8e9, ticks=1, primed=True) for n in range(count)]
    bodies = [
        body_of(n.name, f"{n.name}:1:{n.ticks}", 1.8e9, tick_rows(n, True, 0.2)) for n in nodes
    ]
    rows = sum(len(decode_batch(b).rows) for b in bodies)
    munge = Libmunge()
    credentials = [munge.encode(digest(b).encode()) for b in bodies]
    check = CredentialCheck(munge, lambda node: frozenset({"127.0.0.1"}), ttl=1e12)
    batches = [decode_batch(b) for b in bodies]

    def timed(name: str, each: Callable[[int], object]) -> float:
        index = iter(range(count))
        per = cpu(lambda: each(next(index)), count)
        print(f"{name:>14}: {per * 1e6:8.1f} us/batch {per * 1e6 * count / rows:7.1f} us/row")
        return per

    def credential(i: int) -> None:
        try:
            check.check_credential(credentials[i], bodies[i], batches[i].node)
        except Refusal as refusal:  # not root: decoded all the same
            if refusal.reason != "non_root":
                raise

    print(f"stages: {count} batches, {rows / count:.1f} rows a batch (bench cadence)")
    total = timed("decode_batch", lambda i: decode_batch(bodies[i]))
    total += timed("credential", credential)
    total += timed("decode_rows", lambda i: decode_rows(batches[i]))
    if pg_url:
        decoded = [(b.node, decode_rows(b)) for b in batches]
        total += timed_store(pg_url, decoded, rows, group)
    print(f"{'total':>14}: {total * 1e6:8.1f} us/batch")


def timed_store(url: str, decoded: list[tuple[str, DecodedBatch]], rows: int, group: int) -> float:
    """CPU per batch of Store.write_batches, `group` batches a transaction, in a fresh database."""
    import psycopg
    from sqlalchemy.engine import make_url

    from slurm_gpu.store import Store

    parsed = make_url(url)
    name = f"slurm_gpu_test_stages_{os.getpid()}"
    admin = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        store_url = parsed.set(database=name).render_as_string(hide_password=False)
        cli = [sys.executable, "-m", "slurm_gpu.cli.main", "db", "upgrade", "--url", store_url]
        subprocess.run(cli, check=True, stdout=subprocess.DEVNULL)
        store = Store(store_url, cluster="bench", pool_size=1)
        groups = [decoded[i : i + group] for i in range(0, len(decoded), group)]
        store.write_batches(groups[0])  # connects, warms up
        started, wall = time.process_time(), time.monotonic()
        for batches in groups[1:]:
            store.write_batches(batches)
        per = (time.process_time() - started) / (len(decoded) - len(groups[0]))
        per_wall = (time.monotonic() - wall) / (len(decoded) - len(groups[0]))
        store.engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        f"{'write_batches':>14}: {per * 1e6:8.1f} us/batch {per * 1e6 * len(decoded) / rows:7.1f}"
        f" us/row (wall {per_wall * 1e6:.0f} us/batch, {group} batches a transaction)"
    )
    return per


if __name__ == "__main__":
    main()
