r"""Pure parsers for `scontrol` and `sinfo` output: job GPU details, ping, config, nodes.

They read `scontrol -d show job`, `scontrol ping`, `scontrol show config` and the node
listings (`sinfo`; `scontrol -o show node` for GPU counts).

`scontrol -d show job` is where Slurm says which GPU indices a running job holds on
each node (https://slurm.schedmd.com/scontrol.html, "-d, --details"):

    JobId=275 JobName=multi
       ...
       JOB_GRES=gpu:a100:1,gpu:h100:1
         Nodes=gpu1 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0)
         Nodes=gpu2 CPU_IDs=0 Mem=0 GRES=gpu:h100:1(IDX:0)

Nodes with identical allocations share one line (`Nodes=gpu[1-2] ... GRES=gpu:1(IDX:0)`),
and an IDX list may hold commas (`IDX:0,2-3`). JobName is printed raw at the end of the
first line and may span lines; when the caller knows the names (from squeue) they are
skipped exactly, so a job named "x\n Nodes=gpu1 GRES=gpu:4(IDX:0-3)" cannot forge an
allocation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpu.errors import SlurmError, brief
from slurm_gpu.slurm.hostlist import expand as expand_hostlist

NodeGpus = tuple[tuple[str, tuple[int, ...]], ...]
"""((node, (Slurm GPU index, ...)), ...) in the order scontrol printed the nodes."""

_RECORD_START = re.compile(r"^JobId=([0-9]+)\b", re.MULTILINE)
_INDEX_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")

MAX_GPU_INDEX = 1023
"""The highest GPU index believed on one node (a node has at most a few hundred GPUs);
a larger one is damage, and would otherwise make `0-999999999` a billion-item tuple."""

_MAX_JOB_ID = 2**32  # Slurm job ids are uint32
_DETAIL_LINE = re.compile(r"^\s+Nodes=(\S+)\s(?:.*\s)?GRES=(\S*)\s*$")
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::([^:(),]+))?(?::(\d+))?\(IDX:([^)]*)\)")
# gres/shard and gres/mps on one node: "shard:2(IDX:0)", "shard:a100:2(IDX:0)", "mps:50(...)"
_SHARE_GRES = re.compile(r"(?:^|,)(shard|mps)(?::([^:(),]+))?:(\d+)\(IDX:([^)]*)\)")


def parse_index_list(text: str) -> tuple[int, ...]:
    """GPU indices of an IDX list: "0-1,3" -> (0, 1, 3); "N/A" or "" -> ().

    Raises ValueError when malformed, SlurmError for an index above MAX_GPU_INDEX.
    """
    text = text.strip()
    if text in ("", "N/A"):
        return ()
    indices: list[int] = []
    for part in text.split(","):
        match = _INDEX_RANGE.fullmatch(part)
        if match is None:
            raise ValueError(f"bad GPU index range {brief(part)}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        # Length first: int() of thousands of digits is slow, then refused.
        if max(len(lo_text), len(hi_text)) > 6 or int(hi_text) > MAX_GPU_INDEX:
            raise SlurmError(f"GPU index range {brief(part)} beyond index {MAX_GPU_INDEX}")
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"bad GPU index range {brief(part)}")
        indices.extend(range(lo, hi + 1))
    return tuple(indices)


def gpus_in_gres(text: str) -> tuple[int, ...]:
    """GPU indices in one node's GRES value (`gpu:a100:2(IDX:0-1),mps:0(...)` -> (0, 1)).

    Raises ValueError when an entry's count disagrees with its index list, SlurmError
    for an absurd index.
    """
    indices: list[int] = []
    for match in _GPU_GRES.finditer(text):
        found = parse_index_list(match.group(3))
        if match.group(2) is not None and int(match.group(2)) != len(found):
            raise ValueError(f"GRES {match.group(0).lstrip(',')!r}: count != indices")
        indices.extend(found)
    return tuple(sorted(set(indices)))


def parse_job_gpu_details(
    text: str, names: Mapping[int, str] | None = None
) -> tuple[dict[int, NodeGpus], list[str]]:
    """GPU indices per node of every job in `scontrol -d show job` output.

    Args:
        text: scontrol's stdout (any number of jobs).
        names: {job_id: job name} as squeue reported them; a known name is skipped
            exactly, so a name with newlines cannot fake detail lines.

    Returns:
        ({job_id: ((node, indices), ...)}, problems). Jobs without GPU detail lines
        (pending, no GPUs) map to (). A job whose detail lines do not parse is left out
        and described in problems.
    """
    names = names or {}
    details: dict[int, NodeGpus] = {}
    problems: list[str] = []
    starts = _record_starts(text, names)
    # A record ends where the next one begins, so the next job's name (already
    # skipped as its own) is never read as part of this job's body.
    ends = [start for start, _body, _job in starts[1:]] + [len(text)] * bool(starts)
    seen: set[int] = set()
    for (start, body_start, job_id), next_start in zip(starts, ends, strict=True):
        if job_id is None:
            line = text[start:body_start].split("\n", 1)[0]
            problems.append(f"scontrol -d show job: bad JobId in {brief(line)}; skipped")
            continue
        if job_id in seen:
            # Twice: one of them came from a job name; neither can be trusted.
            details.pop(job_id, None)
            problems.append(f"scontrol -d show job: job {job_id} listed twice; GPUs unknown")
            continue
        seen.add(job_id)
        try:
            details[job_id] = _node_gpus(text[body_start:next_start])
        except (ValueError, SlurmError) as exc:
            problems.append(f"scontrol -d show job: job {job_id}: {exc}; GPUs unknown")
    return details, problems


def _record_starts(text: str, names: Mapping[int, str]) -> list[tuple[int, int, int | None]]:
    """[(record offset, offset where its body begins, job_id)], skipping known names.

    job_id is None when the JobId is not a Slurm job id (too long, out of range).
    """
    starts: list[tuple[int, int, int | None]] = []
    position = 0
    while True:
        match = _RECORD_START.search(text, position)
        if match is None:
            return starts
        digits = match.group(1)
        job_id = int(digits) if len(digits) <= 10 and int(digits) < _MAX_JOB_ID else None
        name = names.get(job_id) if job_id is not None else None
        marker = text.find(" JobName=", match.end())
        line_end = text.find("\n", match.end())
        line_end = len(text) if line_end < 0 else line_end
        if name is not None and marker >= 0 and text.startswith(name, marker + 9):
            body_start = marker + 9 + len(name)
        else:
            body_start = line_end
        starts.append((match.start(), body_start, job_id))
        position = max(body_start, match.end())


def _node_gpus(body: str) -> NodeGpus:
    per_node: dict[str, tuple[int, ...]] = {}
    for line in body.splitlines():
        match = _DETAIL_LINE.match(line)
        if match is None:
            continue
        indices = gpus_in_gres(match.group(2))
        if not indices:
            continue
        for node in expand_hostlist(match.group(1)):
            if node in per_node:
                raise ValueError(f"node {node} listed twice")
            per_node[node] = indices
    return tuple(per_node.items())


def job_node_shares(text: str, job_id: int, node: str) -> tuple[str, int] | None:
    """(kind, count) of the gres/shard or gres/mps units job `job_id` holds on `node`.

    From `scontrol -d show job JOB` output, whose per-node detail lines name them
    (`Nodes=gpu4 CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)`; seen on Slurm 22.05). The prolog's
    environment does not say (a shard job's is a whole-GPU job's: SLURM_JOB_GPUS=0),
    so this is where the node agent learns it. None: the job holds none there.

    Raises:
        ValueError: the job's detail lines do not parse.
    """
    for _start, body_start, found in _record_starts(text, {}):
        if found != job_id:
            continue
        end = text.find("\nJobId=", body_start)
        for line in text[body_start : len(text) if end < 0 else end].splitlines():
            match = _DETAIL_LINE.match(line)
            if match is None or node not in expand_hostlist(match.group(1)):
                continue
            shares = list(_SHARE_GRES.finditer(match.group(2)))
            if len(shares) > 1:
                raise ValueError(f"node {node}: {len(shares)} share entries in {match.group(2)!r}")
            if shares:
                return shares[0].group(1), int(shares[0].group(3))
        return None
    return None


def gpus_from_gres_detail(nodes: tuple[str, ...], detail: tuple[str, ...]) -> NodeGpus | None:
    """GPU indices from squeue --json `gres_detail` (one entry per node, in node order).

    Only trusted for single-node jobs, where the pairing cannot be wrong; None otherwise.
    """
    if len(nodes) != 1 or len(detail) != 1:
        return None
    try:
        indices = gpus_in_gres(detail[0])
    except (ValueError, SlurmError):
        return None
    return ((nodes[0], indices),) if indices else ()


def check_ping(text: str) -> None:
    """Raises SlurmError unless `scontrol ping` says a slurmctld is UP.

    Output: "Slurmctld(primary) at head is UP" (and one line per backup).
    """
    if re.search(r"\bis UP\b", text):
        return
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    raise SlurmError("scontrol ping: slurmctld is not responding: " + ("; ".join(lines)[:200]))


# --- nodes --------------------------------------------------------------------------

SINFO_SEP = "\x1f"
SINFO_END = "\x1e"
SINFO_FORMAT = f"%N{SINFO_SEP}%T{SINFO_SEP}%G{SINFO_SEP}%E{SINFO_END}"
"""`sinfo -h -N -o` fields: node, state (long), gres, reason (last: free text)."""

_STATE_FLAGS = "*~#!%$@^-+"


@dataclass(frozen=True)
class NodeInfo:
    """One compute node as `sinfo -N` lists it.

    Attributes:
        state: sinfo's long state without flag characters ("mixed", "drained",
            "draining", "idle", "down").
        responding: False when sinfo flagged the node with "*" (slurmd not responding).
        reason: why the node is drained or down ("" when none).
        gres: configured generic resources as sinfo prints them ("gpu:a100:4"; with
            autodetected GPUs their socket affinity too: "gpu:a100:4(S:0-7)").
    """

    name: str
    state: str
    reason: str = ""
    gres: str = ""
    responding: bool = True

    @property
    def drained(self) -> bool:
        """True for drained and draining nodes (no new jobs start there)."""
        return self.state.startswith("drain")


def sinfo_argv() -> list[str]:
    """The `sinfo` command line parse_sinfo_nodes reads."""
    return ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]


def parse_sinfo_nodes(text: str) -> tuple[list[NodeInfo], list[str]]:
    """Nodes from `sinfo_argv()` output, one per node (sinfo repeats a node per partition)."""
    nodes: dict[str, NodeInfo] = {}
    problems: list[str] = []
    for piece in text.split(SINFO_END):
        piece = piece.lstrip("\n")
        if not piece.strip():
            continue
        fields = piece.split(SINFO_SEP, 3)
        if len(fields) != 4 or not fields[0].strip() or not fields[1].strip():
            problems.append(f"sinfo: unparsable record {piece[:80]!r}")
            continue
        name, raw_state, gres, reason = (f.strip() for f in fields)
        state = raw_state.lower().rstrip(_STATE_FLAGS)
        if name in nodes:
            continue
        nodes[name] = NodeInfo(
            name=name,
            state=state,
            reason="" if reason.lower() in ("none", "(null)") else reason,
            gres="" if gres == "(null)" else gres,
            responding="*" not in raw_state,
        )
    return list(nodes.values()), problems


# --- GPUs per node ------------------------------------------------------------------

NODE_GPUS_ARGV = ["scontrol", "-o", "show", "node"]
"""One node per line, `Key=Value` tokens; CfgTRES and AllocTRES count the node's GPUs."""

_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=([0-9]+)")
_MAX_GPUS_DIGITS = 6  # a node has at most a few hundred GPUs; more digits is damage


@dataclass(frozen=True)
class GpuNode:
    """A node's GPUs as `scontrol -o show node` counts them.

    Attributes:
        state: scontrol's state as printed ("MIXED", "IDLE+DRAIN", "DOWN*").
        gpus: configured GPUs (CfgTRES `gres/gpu`; 0 when none).
        alloc_gpus: GPUs allocated to jobs now (AllocTRES `gres/gpu`).
        addr: NodeAddr, the address (or host name) slurmctld reaches the node at; ""
            when scontrol printed none. The collector checks credentials against it.
    """

    name: str
    state: str
    gpus: int
    alloc_gpus: int
    addr: str = ""


def parse_node_gpus(text: str) -> tuple[list[GpuNode], list[str]]:
    """GpuNodes from `NODE_GPUS_ARGV` output, in scontrol's order.

    The first `Key=` of a line wins: the free text at the end of a line (Reason=...)
    cannot override the counts before it. A line that names no node, or whose GPU count
    is absurd, is skipped and described in the problems.

    Returns:
        (nodes, problems).
    """
    nodes: list[GpuNode] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        values: dict[str, str] = {}
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep:
                values.setdefault(key, value)
        if "NodeName" not in values:
            problems.append(f"scontrol show node: line {number}: no NodeName in {brief(line)}")
            continue
        try:
            gpus = _gpu_count(values.get("CfgTRES", ""))
            alloc = _gpu_count(values.get("AllocTRES", ""))
        except ValueError as exc:
            problems.append(f"scontrol show node: node {brief(values['NodeName'])}: {exc}")
            continue
        nodes.append(
            GpuNode(
                values["NodeName"],
                values.get("State", ""),
                gpus,
                alloc,
                values.get("NodeAddr", ""),
            )
        )
    return nodes, problems


def _gpu_count(tres: str) -> int:
    match = _GPU_TRES.search(tres)
    if match is None:
        return 0
    if len(match.group(1)) > _MAX_GPUS_DIGITS:
        raise ValueError(f"absurd GPU count in {brief(tres)}")
    return int(match.group(1))


# --- configuration ------------------------------------------------------------------

CONFIG_ARGV = ["scontrol", "show", "config"]


def parse_slurm_user(text: str) -> str | None:
    """The SlurmUser name from `scontrol show config` ("SlurmUser = slurm(64030)" -> slurm).

    Returns None when no SlurmUser line is there.
    """
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "SlurmUser":
            return value.strip().split("(")[0]
    return None
