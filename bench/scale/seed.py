"""Seeds the store with every simulated node's job and inventory (bench/scale --seed).

What each node's first batch carries (its job's started event, its inventory), written as
the collector writes it (Store.write_batches), so the steps measure the steady cadence:
jobs start at the cluster's job rate, not all 12,500 in the first tick.

Usage: seed.py STORE_URL NODES ORIGIN  (run with the collector's code: --source)
"""

from __future__ import annotations

import sys

from load import SimNode, first_rows

from slurm_gpu.node import shipper
from slurm_gpu.node.shipper import DecodedBatch
from slurm_gpu.store import Store

GROUP = 500  # nodes per transaction
CLUSTER = "scale"  # [cluster] name of the collector's config


def main() -> None:
    """Writes the nodes' first rows, GROUP nodes a transaction."""
    url, nodes, origin = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    store = Store(url, cluster=CLUSTER)
    for first in range(0, nodes, GROUP):
        group = []
        for number in range(first, min(nodes, first + GROUP)):
            node = SimNode(number=number, origin=origin)
            batch = DecodedBatch()
            for row in first_rows(node):
                batch.add(row.kind, row.payload)
            group.append((node.name, batch))
        if hasattr(store, "write_batches"):
            store.write_batches(group)
        else:  # a collector before group commit: its shipper's per-kind write_batch
            for name, batch in group:
                shipper.write_batch(store, name, batch)
    store.dispose()


if __name__ == "__main__":
    main()
