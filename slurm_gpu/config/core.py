"""The core sections, the root `Config` that holds every section, and which file is read.

The core sections are [cluster], [store], [node], [slurm] and [logging].

Every setting is one field, with its default and a one-line doc, on a section class (here,
in `slurm_gpu.config.policy` or in `slurm_gpu.config.reports`); a new section is a class
plus one field on `Config`. Loading, validation, `render_config` and `describe_schema`
(the config reference) all follow the fields (`slurm_gpu.config._loader`).

Which file: `--config` beats `$SLURM_GPU_CONFIG` beats `/etc/slurm-gpu/slurm-gpu.toml`.
A missing default file means built-in defaults (the tool works out of the box); a file
named explicitly must exist.

Errors name the file and the dotted key: `<file>: node.interval: ...`. Array elements
are counted from 1, as an admin counts `[[quota]]` blocks: `quota[2].account`.
"""

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm_gpu.config._loader import SettingDoc, doc, parse_settings, read_toml
from slurm_gpu.config._loader import describe_schema as _describe
from slurm_gpu.config.collector import CollectorSettings
from slurm_gpu.config.mailprog import MailProgSettings
from slurm_gpu.config.nats import NatsSettings
from slurm_gpu.config.policy import (
    ControllerSettings,
    NotifySettings,
    PolicySettings,
    QuotaRule,
    check_controller,
    check_notify,
    check_quotas,
)
from slurm_gpu.config.reports import AccessSettings, CostSettings, ReportSettings
from slurm_gpu.durations import Duration
from slurm_gpu.errors import ConfigError

__all__ = [
    "CONFIG_ENV_VAR",
    "CREDENTIALS_GROUP",
    "DEFAULT_CONFIG_PATH",
    "ClusterSettings",
    "Config",
    "LogLevel",
    "LoggingSettings",
    "NodeSettings",
    "SlurmSettings",
    "StoreSettings",
    "describe_schema",
    "load_config",
    "locate_config",
    "read_config",
]

DEFAULT_CONFIG_PATH = Path("/etc/slurm-gpu/slurm-gpu.toml")
# The group that may read the store's credentials (the config, a SQLite store's folder).
CREDENTIALS_GROUP = "slurm-gpu"
CONFIG_ENV_VAR = "SLURM_GPU_CONFIG"


def _check_store_url(url: str) -> str | None:
    # SQLAlchemy URL forms: https://docs.sqlalchemy.org/en/20/core/engines.html#database-urls
    match = re.match(r"^([A-Za-z][A-Za-z0-9]*)(\+[A-Za-z0-9_]+)?://", url)
    if match and match.group(1) in {"sqlite", "postgresql", "mysql", "mariadb"}:
        return None
    shown = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)  # never echo a password
    return (
        "unsupported database URL; expected sqlite:///PATH, postgresql[+driver]://... or "
        f"mysql|mariadb[+driver]://..., got {json.dumps(shown)}"
    )


def _check_listen_address(address: str) -> str | None:
    if address == "":
        return None
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]*):(\d{1,5})", address)
    if match and 0 < int(match.group(2)) < 65536:
        return None
    return (
        'expected "host:port" (e.g. "0.0.0.0:9400", ":9400", "[::]:9400") or "" for off, '
        f"got {json.dumps(address)}"
    )


def _check_collector_url(url: str) -> str | None:
    if url == "" or re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
        return None
    return f'expected "http://HOST:PORT" or "", got {json.dumps(url)}'


# ---------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class ClusterSettings:
    """[cluster]: which Slurm cluster this is."""

    name: str = field(
        default="", metadata=doc('Cluster name as Slurm knows it; "" asks Slurm (ClusterName).')
    )


@dataclass(frozen=True)
class StoreSettings:
    """[store]: the accounting database."""

    url: str = field(
        default="sqlite:////var/lib/slurm-gpu/accounting.db",
        metadata=doc(
            "SQLAlchemy URL of the accounting store: sqlite, postgresql or mysql/mariadb.",
            check=_check_store_url,
        ),
    )
    readings_retention: Duration = field(
        default=Duration(90 * 86400.0),
        metadata=doc(
            "How long per-minute GPU readings are kept; job summaries are kept forever.",
            above=0,
        ),
    )
    ship_aggregate: Duration = field(
        default=Duration(60.0),
        metadata=doc("Readings are shipped to the store as aggregates over this period.", above=0),
    )
    echo_sql: bool = field(default=False, metadata=doc("Log every SQL statement (debugging)."))


@dataclass(frozen=True)
class NodeSettings:
    """[node]: the per-node agent and the prolog/epilog hooks."""

    state_dir: Path = field(
        default=Path("/var/lib/slurm-gpu/node"),
        metadata=doc("Local state: one subdirectory per node (bindings, events, spool)."),
    )
    interval: Duration = field(
        default=Duration(10.0), metadata=doc("How often GPUs are sampled.", above=0)
    )
    gres_conf: Path = field(
        default=Path("/etc/slurm/gres.conf"),
        metadata=doc("Slurm's gres.conf, read to map GPU device files to GPUs."),
    )
    mig_minors: Path = field(
        default=Path("/proc/driver/nvidia-caps/mig-minors"),
        metadata=doc(
            "The NVIDIA driver's mig-minors file, read to tie gres.conf's MultipleFiles="
            " (MIG) device files to MIG devices."
        ),
    )
    active_threshold_percent: float = field(
        default=5.0,
        metadata=doc(
            "A GPU below this utilization percent is idle, at or above it active: for the"
            " agent's records, [policy.idle_gpu] and the reports.",
            minimum=0,
            maximum=100,
        ),
    )
    sm_active_threshold_percent: float = field(
        default=5.0,
        metadata=doc(
            "A GPU whose NVML GPM SM activity is below this percent is idle, at or above it"
            ' active (GpuActivity.last_sm_active; [policy.idle_gpu] signal = "sm_active").',
            minimum=0,
            maximum=100,
        ),
    )
    gpm: bool = field(
        default=True,
        metadata=doc(
            "Read NVML GPM metrics (SM activity, occupancy, tensor, DRAM bandwidth) on GPUs"
            " that have them (Hopper and newer); false makes no GPM call at all."
        ),
    )
    write_admin_comment: bool = field(
        default=False,
        metadata=doc("Write each job's GPU summary into its Slurm AdminComment at job end."),
    )
    metrics_address: str = field(
        default="",
        metadata=doc(
            'Prometheus /metrics listen address "host:port"; "" turns the exporter off.',
            check=_check_listen_address,
        ),
    )
    ship_batch_size: int = field(
        default=5000, metadata=doc("Most readings shipped to the store per batch.", above=0)
    )
    ship_backoff_max: Duration = field(
        default=Duration(300.0),
        metadata=doc("Longest wait between retries while the store is down.", above=0),
    )
    ship_interval: Duration = field(
        default=Duration(0.0),
        metadata=doc(
            "Seconds between shipments: rows wait in the spool up to this long and leave"
            " in one batch (several ticks a message over NATS). The controller allows for"
            " it before it calls a node's readings late (unknown, never idle). 0 ships"
            " them as soon as they are written.",
            minimum=0,
        ),
    )
    missing_after_intervals: int = field(
        default=3,
        metadata=doc("A GPU with no reading for this many intervals is missing.", minimum=1),
    )
    activity_refresh: Duration = field(
        default=Duration(300.0),
        metadata=doc(
            "Longest time the agent goes without shipping a running job's GPU activity when"
            " it has not changed; a heartbeat every interval vouches for it in between.",
            above=0,
        ),
    )
    job_check_interval: Duration = field(
        default=Duration(60.0),
        metadata=doc(
            "How often the agent asks Slurm (one squeue of the jobs bound here, only while"
            " jobs are) whether they still hold their GPUs, to close the runs of jobs that"
            " ended without an epilog (NODE_FAIL, slurmd killed, node set DOWN) at Slurm's"
            ' end; "0" never asks (only epilogs end runs).',
            minimum=0,
        ),
    )
    munge_socket: str = field(
        default="",
        metadata=doc(
            "munged's socket for signing batches to the collector; \"\" is libmunge's"
            " default (/run/munge/munge.socket.2)."
        ),
    )
    ship_to: Literal["store", "collector", "nats"] = field(
        default="store",
        metadata=doc(
            'Where the agent ships its spool: "store" writes [store] url itself (one machine),'
            ' "collector" posts MUNGE-signed batches to collector_url, "nats" publishes them'
            " to the JetStream stream of [nats] for the ingest workers (a cluster)."
        ),
    )
    collector_url: str = field(
        default="",
        metadata=doc(
            'The head node\'s collector for ship_to = "collector", e.g. "http://head:6830".',
            check=_check_collector_url,
        ),
    )


def _check_node(node: NodeSettings) -> str | None:
    if node.ship_to == "collector" and not node.collector_url:
        return 'ship_to = "collector" needs collector_url (e.g. "http://head:6830")'
    return None


@dataclass(frozen=True)
class SlurmSettings:
    """[slurm]: how Slurm commands are run."""

    bin_dir: str = field(
        default="", metadata=doc('Directory holding squeue, scontrol, ...; "" searches PATH.')
    )
    command_timeout: Duration = field(
        default=Duration(30.0),
        metadata=doc("A Slurm command running longer than this is killed.", above=0),
    )
    conf: str = field(
        default="",
        metadata=doc('slurm.conf to use; "" lets Slurm decide ($SLURM_CONF or its default).'),
    )


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


@dataclass(frozen=True)
class LoggingSettings:
    """[logging]: how much the tools log."""

    level: LogLevel = field(default="INFO", metadata=doc("Least severe log level written."))


@dataclass(frozen=True)
class Config:
    """The whole slurm-gpu configuration: one attribute per `[section]`."""

    cluster: ClusterSettings = field(
        default_factory=ClusterSettings, metadata=doc("Which Slurm cluster this is.")
    )
    store: StoreSettings = field(
        default_factory=StoreSettings, metadata=doc("The accounting store (database).")
    )
    node: NodeSettings = field(
        default_factory=NodeSettings,
        metadata=doc("The node agent and the Slurm hooks.", check=_check_node),
    )
    slurm: SlurmSettings = field(
        default_factory=SlurmSettings, metadata=doc("Running Slurm commands.")
    )
    logging: LoggingSettings = field(default_factory=LoggingSettings, metadata=doc("Logging."))
    controller: ControllerSettings = field(
        default_factory=ControllerSettings,
        metadata=doc("The policy controller on the head node.", check=check_controller),
    )
    policy: PolicySettings = field(
        default_factory=PolicySettings, metadata=doc("The policies the controller applies.")
    )
    quota: list[QuotaRule] = field(
        default_factory=list,
        metadata=doc("GPU budgets per account or user ([[quota]] blocks).", check=check_quotas),
    )
    notify: NotifySettings = field(
        default_factory=NotifySettings,
        metadata=doc("E-mail and webhook notifications.", check=check_notify),
    )
    cost: CostSettings = field(
        default_factory=CostSettings, metadata=doc("GPU prices for the cost columns.")
    )
    access: AccessSettings = field(
        default_factory=AccessSettings, metadata=doc("Who sees whose jobs in reports.")
    )
    reports: ReportSettings = field(
        default_factory=ReportSettings, metadata=doc("The sacct, report, job, status commands.")
    )
    mailprog: MailProgSettings = field(
        default_factory=MailProgSettings,
        metadata=doc("Slurm's MailProg wrapper: the GPU report in the end-of-job mail."),
    )
    collector: CollectorSettings = field(
        default_factory=CollectorSettings,
        metadata=doc("The head node's collector: the node agents' batches, the store's writer."),
    )
    nats: NatsSettings = field(
        default_factory=NatsSettings,
        metadata=doc("NATS JetStream: the agents' batches to the ingest workers (ship_to = nats)."),
    )


def shipping_delay(config: Config) -> float:
    """Seconds a reading may take to reach the store after its period ends.

    One [store] ship_aggregate period (intervals are aggregated over it), one [node]
    interval (the tick that closes it) and [node] ship_interval (rows wait that long in
    the spool). Every "is this node's data late" rule adds this, so that a node whose
    batches travel less often is never judged on readings that are merely on the way.
    """
    return (
        float(config.store.ship_aggregate)
        + float(config.node.interval)
        + float(config.node.ship_interval)
    )


# ---------------------------------------------------------------------------- loading


def locate_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    default_path: Path = DEFAULT_CONFIG_PATH,
) -> Path | None:
    """Which file to read: `path` (--config), else $SLURM_GPU_CONFIG, else the default.

    Args:
        path: the --config file, if given.
        env: environment to read $SLURM_GPU_CONFIG from (default: os.environ).
        default_path: the file used when none is named.

    Returns:
        The file to read, or None when no file was named and `default_path` does not
        exist (built-in defaults apply). An explicitly named file is returned even when
        missing, so that reading it reports the error.
    """
    if path is not None:
        return path
    named = (os.environ if env is None else env).get(CONFIG_ENV_VAR, "")
    if named:
        return Path(named)
    return default_path if default_path.exists() else None


def load_config(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    default_path: Path = DEFAULT_CONFIG_PATH,
) -> Config:
    """Load the effective configuration (see `locate_config` for which file).

    Raises:
        ConfigError: every problem found, one line each, naming the file and the key.
    """
    return read_config(locate_config(path, env, default_path))


def read_config(file: Path | None) -> Config:
    """Read and validate one config file; None gives the built-in defaults.

    Raises:
        ConfigError: the file is unreadable, not TOML, or not a valid config.
    """
    if file is None:
        return Config()
    if file.exists() and not os.access(file, os.R_OK, effective_ids=True):
        # The usual cause on a cluster: the file holds the store's credentials and is
        # root:slurm-gpu 0640; users reach it through the setgid `slurm-gpu` command.
        raise ConfigError(
            [
                f"{file}: permission denied: it is readable by root and the {CREDENTIALS_GROUP}"
                f" group only; run the users' command (scripts/install-user-command installs"
                f" it as /usr/local/bin/slurm-gpu) or ask an administrator"
            ]
        )
    return parse_settings(Config, read_toml(file), str(file))


def describe_schema(schema: type[Any] = Config) -> Iterator[SettingDoc]:
    """Every key of the schema with its type, default and doc (the config reference)."""
    return _describe(schema)
