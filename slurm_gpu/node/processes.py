"""Whose a GPU's processes are: a pid's Slurm job and owner, and use outside any allocation.

`job_of_pid` maps a process to the job it belongs to (its cgroup, else its SLURM_JOB_ID);
`UnallocatedUse` finds the processes on a GPU that belong to no job holding it (DESIGN:
security) and logs each once while it runs there.
"""

from __future__ import annotations

import logging
import pwd
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from slurm_gpu.gpu import GpuSnapshot
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.binding import GpuBinding

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")

_CGROUP_JOB = re.compile(rb"/job_(\d+)(?:/|$)", re.MULTILINE)
# Slurm 26.05's cgroup/v2 names a job's cgroup by its SLUID unless cgroup.conf says
# CgroupJobIdPaths=yes: src/plugins/cgroup/v2/cgroup_v2.c, cgroup_p_step_create
# ("/job_%u" with cgroup_job_id_paths, else "/%s" of print_sluid), under which come
# step_N/user/task_N. A SLUID is "s" and 13 characters of Crockford's base 32
# (src/common/sluid.c, print_sluid).
_CGROUP_SLUID = re.compile(rb"/(s[0-9A-HJKMNP-TV-Z]{13})(?:/|$)", re.MULTILINE)


def job_of_pid(
    pid: int, proc: Path = Path("/proc"), sluids: Mapping[str, int] | None = None
) -> int | None:
    """The Slurm job a process belongs to: its cgroup, else its SLURM_JOB_ID.

    The cgroup is Slurm's and cannot be changed by the job's user; the environment can.
    A cgroup path names the job as `/job_N/` (Slurm before 25.11, or CgroupJobIdPaths=yes)
    or by its SLUID (26.05's default), which `sluids` (SLUID -> job id, from the hooks'
    bindings) maps to the job. A process in the cgroup of a SLUID no binding on this node
    names belongs to no job holding a GPU here: None, whatever its environment says.
    """
    try:
        cgroup = (proc / str(pid) / "cgroup").read_bytes()
        match = _CGROUP_JOB.search(cgroup)
        if match:
            return int(match.group(1))
        named = _CGROUP_SLUID.search(cgroup)
        if named:
            return (sluids or {}).get(named.group(1).decode())
        for item in (proc / str(pid) / "environ").read_bytes().split(b"\0"):
            if item.startswith(b"SLURM_JOB_ID="):
                value = item.split(b"=", 1)[1]
                return int(value) if value.isdigit() else None
    except OSError:
        return None
    return None


def process_owner(pid: int, proc: Path = Path("/proc")) -> str:
    """The user name owning a process (its real uid), "?" when it is gone."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                uid = int(line.split()[1])
                try:
                    return pwd.getpwuid(uid).pw_name
                except KeyError:
                    return str(uid)
    except (OSError, ValueError, IndexError):
        pass
    return "?"


class UnallocatedUse:
    """Finds the processes on a GPU that belong to no job holding it, and logs each once.

    Args:
        binding: the node's GPU binding (its het job leaders, Slurm indices for the log).
        pid_job: maps a pid to its Slurm job (None: no job).
        pid_owner: maps a pid to its owner's user name, for the log.
    """

    def __init__(
        self,
        binding: GpuBinding,
        pid_job: Callable[[int], int | None],
        pid_owner: Callable[[int], str],
    ) -> None:
        self.binding = binding
        self.pid_job = pid_job
        self.pid_owner = pid_owner
        self._warned_pids: set[tuple[str, int]] = set()  # (GPU uuid, pid) logged

    def strays(
        self, uuid: str, snap: GpuSnapshot, spans: list[JobSpan], now: float
    ) -> tuple[int, ...]:
        """Pids on this GPU that belong to no job holding it now (DESIGN: security).

        Every task of a heterogeneous job carries the leader's SLURM_JOB_ID, whatever its
        component (https://slurm.schedmd.com/heterogeneous_jobs.html, "Environment
        Variables"): a process that names the leader of the het job a holder is a
        component of is that component's own, not GPU use outside an allocation.
        """
        if not snap.processes:  # nothing runs on it: no stray, and no pid to remember
            if self._warned_pids:
                self._warned_pids = {w for w in self._warned_pids if w[0] != uuid}
            return ()
        het = self.binding.het
        holders = {s.job_id for s in spans if s.end is None or s.end >= now}
        holders |= {het[j] for j in holders if j in het}
        jobs = {p.pid: self.pid_job(p.pid) for p in snap.processes or ()}
        strays = tuple(pid for pid, job in jobs.items() if job not in holders)
        for pid in strays:
            if (uuid, pid) not in self._warned_pids:
                self._warned_pids.add((uuid, pid))
                job = jobs[pid]
                log.warning(
                    "unallocated GPU use: pid %d (user %s, %s) on GPU %s (%s) belongs to no"
                    " job holding it",
                    pid,
                    self.pid_owner(pid),
                    f"Slurm job {job}" if job is not None else "no Slurm job",
                    self.binding.uuid_index.get(uuid, "?"),
                    uuid,
                )
        # Forget pids gone from this GPU: the set stays the size of what runs now.
        self._warned_pids = {w for w in self._warned_pids if w[0] != uuid or w[1] in strays}
        return strays
