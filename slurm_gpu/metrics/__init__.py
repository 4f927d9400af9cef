"""The head node's Prometheus exporter (`slurm-gpu exporter`): cluster, usage, actions.

The node agents export each GPU's gauges (slurm_gpu/node/exporter.py); this package
exports what only Slurm and the store know: GPUs by state, GPU-hours and cost per user
and account, the controller's actions. conf/prometheus/ and conf/grafana/ use both.
"""
