"""`slurm-gpu node run`: the agent's tick loop, the shipper thread and /metrics together."""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurm_gpu.config import Config
from slurm_gpu.gpu.nvml import NvmlSource
from slurm_gpu.munge import Libmunge
from slurm_gpu.node.agent import NodeAgent
from slurm_gpu.node.collector_sink import CollectorSink
from slurm_gpu.node.exporter import NodeMetrics
from slurm_gpu.node.job_liveness import JobLiveness
from slurm_gpu.node.outbox import device_fields
from slurm_gpu.node.shipper import BatchSink, Shipper, StoreSink
from slurm_gpu.node.spool import Spool
from slurm_gpu.slurm.admin_comment import write_job_summary
from slurm_gpu.slurm.gres import load_gres_node
from slurm_gpu.slurm.mig_minors import MigMinors, load_mig_minors
from slurm_gpu.slurm.node_jobs import ask_node_jobs
from slurm_gpu.slurm.runner import CommandRunner
from slurm_gpu.slurm.scontrol import job_node_shares
from slurm_gpu.store import Store

log = logging.getLogger(__name__)


def default_node_name() -> str:
    """The short host name, as slurmd uses when -N is not given."""
    return socket.gethostname().split(".")[0]


def spool_path(config: Config, node: str) -> Path:
    """<state_dir>/<node>/spool.db."""
    return Path(config.node.state_dir) / node / "spool.db"


def node_mig_minors(config: Config) -> MigMinors | None:
    """The driver's mig-minors file ([node] mig_minors) where it exists, else None.

    The driver writes it on every node with MIG support; without it no GPU has MIG
    devices and no MIG slot is numbered. A file that exists but cannot be read or parsed
    is a ConfigError naming it (and its line).
    """
    path = Path(config.node.mig_minors)
    if not path.exists():
        return None
    return load_mig_minors(path)


def build_agent(config: Config, node: str, slurm: CommandRunner | None = None) -> NodeAgent:
    """A NodeAgent wired to NVML, the node's spool, its gres.conf and its mig-minors.

    With `slurm`, the agent asks `scontrol -d show job` for the shares (gres/shard,
    gres/mps) a job holds on this node, which the prolog cannot tell, and squeue whether
    the jobs bound here still run ([node] job_check_interval, node/job_liveness.py).
    """

    def job_shares(job_id: int) -> tuple[str, int] | None:
        assert slurm is not None
        out = slurm(["scontrol", "-d", "show", "job", str(job_id)])
        return job_node_shares(out, job_id, node)

    node_dir = Path(config.node.state_dir) / node
    interval = float(config.node.interval)
    check = float(config.node.job_check_interval)
    liveness = None
    if slurm is not None and check > 0:
        liveness = JobLiveness(lambda ids: ask_node_jobs(slurm, ids, node), check)
    return NodeAgent(
        node=node,
        node_dir=node_dir,
        source=NvmlSource(gpm=config.node.gpm),
        spool=Spool(spool_path(config, node)),
        gres=load_gres_node(Path(config.node.gres_conf), node),
        interval=interval,
        period=max(float(config.store.ship_aggregate), interval),
        active_threshold=float(config.node.active_threshold_percent),
        max_gap_intervals=float(config.node.missing_after_intervals),
        sm_active_threshold=float(config.node.sm_active_threshold_percent),
        mig_minors=node_mig_minors(config),
        job_shares=job_shares if slurm is not None else None,
        activity_refresh=float(config.node.activity_refresh),
        liveness=liveness,
    )


def collector_sink(config: Config) -> CollectorSink:
    """The sink of `[node] ship_to = "collector"`: batches to collector_url, MUNGE-signed."""
    return CollectorSink(config.node.collector_url, Libmunge(config.node.munge_socket).encode)


def batch_sink(config: Config, node: str) -> BatchSink:
    """The sink of `[node] ship_to`: the collector's, or NATS JetStream's ([nats])."""
    if config.node.ship_to == "nats":
        # Here, not at the top: nats-py is the [nats] extra, which a direct agent lacks.
        from slurm_gpu.node.nats_sink import NatsSink

        return NatsSink(config.nats, config.cluster.name, node)
    return collector_sink(config)


def run_node(
    config: Config,
    node: str,
    store: Store | None,
    slurm: CommandRunner,
    once: bool = False,
    sink: BatchSink | None = None,
) -> int:
    """Runs the agent until SIGTERM/SIGINT (or one tick and one drain with `once`).

    Args:
        config: the configuration ([node], [store] shipping, [cluster] name).
        node: this node's Slurm name.
        store: where the shipper sends the spool's rows (the caller closes it); None
            with `[node] ship_to = "collector"` or "nats", where the agent holds no store.
        slurm: runs `scontrol` for the jobs' AdminComment.
        once: one tick and one shipping pass, then return.
        sink: where batches go instead of the store (default for ship_to = "collector"
            or "nats": `batch_sink(config, node)`).
    """
    agent = build_agent(config, node, slurm)
    target: StoreSink | BatchSink
    if config.node.ship_to != "store":
        target = sink if sink is not None else batch_sink(config, node)
        where = config.nats.url if config.node.ship_to == "nats" else config.node.collector_url
        log.info("shipping to the %s at %s", config.node.ship_to, where)
    elif store is None:
        raise ValueError('run_node: ship_to = "store" needs the store')
    else:
        target = store
    # The AdminComment is written from the store's summaries of the job (every node's):
    # an agent that ships to the collector cannot read them.
    comment_store = store if config.node.ship_to == "store" else None
    if config.node.write_admin_comment and comment_store is None:
        log.warning(
            "write_admin_comment is ignored with ship_to = %r (the agent reads no store;"
            " the collector or the ingest workers write it)",
            config.node.ship_to,
        )

    def write_admin_comments(job_ids: list[int]) -> None:
        assert comment_store is not None
        for job_id in job_ids:
            write_job_summary(
                slurm, job_id, comment_store.job_summaries(job_id), config.cluster.name
            )

    def open_shipper() -> Shipper:
        shipper = Shipper(
            Spool(spool_path(config, node)),
            target,
            node,
            batch_size=config.node.ship_batch_size,
            backoff_max=float(config.node.ship_backoff_max),
            ship_interval=float(config.node.ship_interval),
            on_summaries=(
                write_admin_comments
                if config.node.write_admin_comment and comment_store is not None
                else None
            ),
        )
        if config.node.ship_to == "nats":  # the controller may ask it to ship now
            from slurm_gpu.jetstream.bus import flush_subject
            from slurm_gpu.jetstream.flush import serve_flush_requests
            from slurm_gpu.node.nats_sink import NatsSink

            if isinstance(target, NatsSink):
                subject = flush_subject(config.nats, config.cluster.name, node)
                serve_flush_requests(shipper, target.bus, subject)
        return shipper

    with agent.spool.transaction() as db:
        agent.spool.queue(
            db,
            "inventory",
            f"inventory:{node}",
            {"devices": [device_fields(d) for d in agent.devices], "seen_at": time.time()},
        )
    metrics = NodeMetrics()
    if config.node.metrics_address:
        try:
            metrics.serve(config.node.metrics_address)
        except OSError as exc:  # accounting matters more than the dashboard: keep going
            log.error("cannot serve /metrics on %s: %s", config.node.metrics_address, exc)
    log.info(
        "node agent for %s: %d GPUs, interval %.0fs, spool %s",
        node,
        len(agent.devices),
        agent.interval,
        agent.spool.path,
    )
    if once:
        agent.tick()
        _ship(open_shipper, lambda shipper: shipper.drain())
        return 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ship_thread = threading.Thread(
        target=_ship, args=(open_shipper, lambda shipper: shipper.run(stop)), daemon=True
    )
    ship_thread.start()
    next_tick = time.monotonic()
    while not stop.is_set():
        try:
            result = agent.tick()
            metrics.update(
                node,
                agent.devices,
                agent.uuid_index,
                agent.spool.spans(),
                result,
                agent.spool.backlog(),
            )
            if result.summaries:
                log.info("summarized jobs %s", sorted({s.job_id for s in result.summaries}))
        except Exception:  # a bad tick must not kill the agent; the next one retries
            log.exception("tick failed")
        next_tick += agent.interval
        stop.wait(max(0.0, next_tick - time.monotonic()))
    ship_thread.join(timeout=30)
    return 0


def _ship(open_shipper: Callable[[], Shipper], work: Callable[[Shipper], object]) -> None:
    """Opens a shipper, lets it `work`, then closes its spool connection.

    All three in the calling thread: a sqlite3 connection is used and closed only by the
    thread that made it.
    """
    shipper = open_shipper()
    try:
        work(shipper)
    finally:
        shipper.spool.close()


def dump_spool(config: Config, node: str) -> str:
    """The spool's outbox as JSON lines (debugging: `slurm-gpu node spool`)."""
    spool = Spool(spool_path(config, node))
    try:
        rows = spool.pending(10**6)
    finally:
        spool.close()
    if not rows:
        return "spool empty: everything recorded is in the store"
    return "\n".join(json.dumps({"id": i, "kind": k, "key": key}) for i, k, key, _ in rows)
