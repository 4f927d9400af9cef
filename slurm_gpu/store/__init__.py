"""The accounting store: the only package that imports sqlalchemy and alembic.

See README.md in this directory for the schema, the sizing figures and the guarantees.
"""

from slurm_gpu.store.rollup import GpuHourly
from slurm_gpu.store.store import InventoryEntry, Store

__all__ = ["GpuHourly", "InventoryEntry", "Store"]
