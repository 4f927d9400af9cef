"""The collector on the head node: the node agents' spool batches in, the store written.

- `wire`: the request body of POST /v1/batch (encode on the agent, decode here).
- `credential`: the MUNGE and node checks a batch passes before it is written.
- `writer`: the bounded queue and the writers that hold the store's connections.
- `server`: the HTTP server (/v1/batch, /metrics, /healthz) and its refusals.
- `metrics`: what the collector counts for Prometheus.

The layout and its reasons: docs/design/collector.md (issue 16).
"""
