"""Binding: which GPU or MIG slice each Slurm GPU index of this node is.

slurmd numbers a node's GPUs by its gres.conf (`slurm_gpu.slurm.gpu_order`); the hooks
name a job's GPUs by those indices, by the UUIDs slurmd put in CUDA_VISIBLE_DEVICES
(gres.conf Flags=env_uuid), or both. `GpuBinding` keeps the index <-> UUID maps and the
slot each index binds (a whole GPU, a MIG slice), follows slurmd where it names a GPU by
UUID, binds the hooks' events and binding files (asking Slurm for a job's shares where
gres.conf cuts its GPUs into shares), and keeps what the bindings say beyond the GPUs: the
het job leaders and the SLUIDs of the jobs bound here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slurm_gpu.errors import SlurmError
from slurm_gpu.models import (
    Binding,
    GpuDevice,
    GpuSlot,
    JobEvent,
    JobEventKind,
    LostGpu,
    MigDevice,
    SlotKind,
)
from slurm_gpu.node.attribution import JobSpan
from slurm_gpu.node.hookfiles import UNKNOWN_INDEX, BindingFile, EventFile, read_binding_files
from slurm_gpu.slurm.gpu_order import slurm_gpu_order
from slurm_gpu.slurm.gres import GresGpuFile, GresNode
from slurm_gpu.slurm.mig_minors import MigMinors

# The agent's logger: what the tick's collaborators log reads as the agent's, as before.
log = logging.getLogger("slurm_gpu.node.agent")


class GpuBinding:
    """Slurm index <-> NVML GPU (or MIG slice) on one node, and what the bindings say.

    Args:
        node: Slurm node name.
        devices: the GPUs NVML lists.
        gres: this node's gres.conf lines (its File= entries, no AutoDetect).
        stat: os.stat, for resolving device minors.
        mig_minors: the driver's mig-minors, which numbers gres.conf's MIG lines.
        job_shares: job id -> (kind, count) of the gres/shard or gres/mps units it holds
            on this node, or None; None: never asked (see `NodeAgent`).
    """

    def __init__(
        self,
        node: str,
        devices: list[GpuDevice],
        gres: GresNode | list[GresGpuFile],
        stat: Callable[[str], os.stat_result],
        mig_minors: MigMinors | None,
        job_shares: Callable[[int], tuple[str, int] | None] | None,
    ) -> None:
        self.job_shares = job_shares
        # GPUs and MIG devices NVML lists (a MIG UUID is a slot id CUDA_VISIBLE_DEVICES names)
        self.nvml_uuids = {d.uuid for d in devices}
        self.migs: dict[str, tuple[GpuDevice, MigDevice]] = {
            m.uuid: (d, m) for d in devices for m in d.mig_devices
        }
        self.nvml_uuids |= set(self.migs)
        self._uuid_warned: set[tuple[int, str]] = set()  # (job, uuid) logged as unbindable
        # Slurm index -> NVML device, numbered as slurmd numbers them (gpu_order).
        self.gpu_order = slurm_gpu_order(
            gres if isinstance(gres, GresNode) else GresNode.listing(node, gres),
            devices,
            stat,
            mig_minors,
        )
        for problem in self.gpu_order.problems:
            log.error("%s", problem)
        self.index_uuid: dict[int, str] = self.gpu_order.index_uuid()
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}
        # Slurm index -> the slot it binds (a whole GPU, a MIG slice)
        self.index_slot: dict[int, GpuSlot] = self.gpu_order.index_slot()
        # (kind, Slurm index) -> shards (or mps) configured on that GPU (gres.conf)
        self.capacity = {(c.kind, c.index): c for c in self.gpu_order.shares}
        self.het: dict[int, int] = {}  # job id: its het job's leader, from the bindings
        self.sluid_jobs: dict[str, int] = {}  # SLUID -> job id, of the jobs bound here

    def unlisted(self, devices: list[GpuDevice], now: float) -> dict[str, LostGpu]:
        """gres.conf's GPUs NVML does not list, as lost GPUs ("minor:N")."""
        lost: dict[str, LostGpu] = {}
        minors = {d.minor for d in devices}
        for gpu in self.gpu_order.gpus:
            # A GPU NVML lists but gres.conf's line cannot bind (a whole GPU in MIG mode, a
            # MIG line mig-minors does not know) is a problem logged above, not a lost GPU.
            if gpu.uuid is None and gpu.minor is not None and gpu.minor not in minors:
                reason = (
                    f"gres.conf GPU {gpu.index} (/dev/nvidia{gpu.minor}) is not among NVML's GPUs"
                )
                lost[f"minor:{gpu.minor}"] = LostGpu("", gpu.minor, now, reason)
        return lost

    def orphans(self, node_dir: Path, spans: list[JobSpan]) -> list[JobSpan]:
        """The spans of the bindings no span has (their started event was lost).

        Reads the hooks' binding files: the het leaders and SLUIDs are theirs from now on.
        """
        files = read_binding_files(node_dir)
        if not files:  # no job holds a GPU here
            self.het = {}
            self.sluid_jobs.clear()
            return []
        bindings = self.bound_bindings(files)
        known = {(s.job_id, s.restart, s.slurm_index) for s in spans}
        self.het = {b.job_id: b.het_job_id for b in bindings if b.het_job_id is not None}
        return [
            JobSpan(
                b.job_id,
                b.slurm_index,
                b.start,
                None,
                b.user,
                b.account,
                b.partition,
                b.restart,
                b.shards,
                b.shard_kind,
            )
            for b in bindings
            if (b.job_id, b.restart, b.slurm_index) not in known
        ]

    # --- GPUs named by UUID (gres.conf Flags=env_uuid) -------------------------------

    def bound_event(self, item: EventFile) -> JobEvent:
        """The event with its GPUs bound by the UUIDs slurmd named, where it named them.

        With indices and UUIDs (the prolog's SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES,
        paired by slurmd itself) each index is bound to its UUID; with UUIDs alone each
        UUID is looked up among the GPUs this node's gres.conf maps.
        """
        event = self.with_shares(item.event)
        if not item.gpu_uuids:
            return event
        if event.gpu_indices:
            for index, uuid in zip(event.gpu_indices, item.gpu_uuids, strict=True):
                self.follow_slurm(index, uuid, event.job_id)
            return event
        found = (self.index_of(uuid, event.job_id) for uuid in item.gpu_uuids)
        return replace(event, gpu_indices=tuple(i for i in found if i is not None))

    def with_shares(self, event: JobEvent) -> JobEvent:
        """A started job on GPUs gres.conf cuts into shares, with the shares Slurm gave it.

        The prolog cannot tell a shard job from a whole-GPU job on the same GPU (Slurm
        22.05 gives both SLURM_JOB_GPUS=0 and nothing more), so the agent asks Slurm once
        per such job (`job_shares`: scontrol -d show job). Where Slurm cannot be asked,
        the job is recorded as holding its whole GPUs, and the error says so.
        """
        if (
            event.kind != JobEventKind.STARTED
            or event.shards
            or self.job_shares is None
            or not any(
                (kind, index) in self.capacity
                for index in event.gpu_indices
                for kind in (SlotKind.SHARD.value, SlotKind.MPS.value)
            )
        ):
            return event
        try:
            found = self.job_shares(event.job_id)
        except (SlurmError, ValueError) as exc:
            log.error(
                "job %d: cannot tell whether it holds shares of Slurm GPU %s (%s):"
                " recorded as holding the whole GPU",
                event.job_id,
                ",".join(map(str, event.gpu_indices)),
                exc,
            )
            return event
        if found is None:
            return event
        kind, count = found
        return replace(event, shards=count, shard_kind=kind)

    def bound_bindings(self, files: list[BindingFile]) -> list[Binding]:
        """The bindings by Slurm index (UUID-only ones looked up); learns the SLUIDs."""
        self.sluid_jobs.clear()
        bindings = []
        for item in files:
            binding = item.binding
            if item.sluid:
                self.sluid_jobs[item.sluid] = binding.job_id
            if item.gpu_uuid and binding.slurm_index == UNKNOWN_INDEX:
                index = self.index_of(item.gpu_uuid, binding.job_id)
                if index is None:
                    continue
                binding = replace(binding, slurm_index=index)
            elif item.gpu_uuid:
                self.follow_slurm(binding.slurm_index, item.gpu_uuid, binding.job_id)
            bindings.append(binding)
        return bindings

    def follow_slurm(self, index: int, uuid: str, job_id: int) -> None:
        """slurmd says Slurm GPU `index` is `uuid`: bind the index to that GPU.

        The UUID is the GPU the job's CUDA programs see, so it wins over what gres.conf's
        device files gave (an AutoDetect node has none); a conflict is logged as an error.
        A UUID NVML does not list here leaves the index as it was, and is logged. A MIG
        UUID (slurmd always names MIG slots by UUID) binds the index to that MIG slice.
        """
        if self.index_uuid.get(index) == uuid:
            return
        if uuid not in self.nvml_uuids:
            if (job_id, uuid) not in self._uuid_warned:
                self._uuid_warned.add((job_id, uuid))
                log.error(
                    "job %d: slurmd names Slurm GPU %d %s (CUDA_VISIBLE_DEVICES), which NVML"
                    " does not list on this node: GPU %d stays bound by gres.conf (%s)",
                    job_id,
                    index,
                    uuid,
                    index,
                    self.index_uuid.get(index, "no GPU"),
                )
            return
        before = self.index_uuid.get(index)
        if before is None:
            log.warning("Slurm GPU %d is %s (slurmd, job %d)", index, uuid, job_id)
        else:
            log.error(
                "Slurm GPU %d is %s by slurmd's CUDA_VISIBLE_DEVICES (job %d), but gres.conf's"
                " device file gave %s: following slurmd",
                index,
                uuid,
                job_id,
                before,
            )
        for other in [i for i, u in self.index_uuid.items() if u == uuid and i != index]:
            del self.index_uuid[other]  # that index was this GPU by gres.conf only
            self.index_slot.pop(other, None)
        self.index_uuid[index] = uuid
        self.uuid_index = {u: i for i, u in self.index_uuid.items()}
        mig = self.migs.get(uuid)
        self.index_slot[index] = mig[1].slot if mig else GpuSlot.whole(uuid)

    def index_of(self, uuid: str, job_id: int) -> int | None:
        """The Slurm index of the GPU `uuid` on this node; None (logged) when unknown."""
        index = self.uuid_index.get(uuid)
        if index is None and (job_id, uuid) not in self._uuid_warned:
            self._uuid_warned.add((job_id, uuid))
            where = "NVML lists it but" if uuid in self.nvml_uuids else "NVML does not list it and"
            log.error(
                "job %d: GPU %s (CUDA_VISIBLE_DEVICES, no SLURM_JOB_GPUS): %s gres.conf gives"
                " it no Slurm index on this node: not bound",
                job_id,
                uuid,
                where,
            )
        return index
