"""Spool batches over NATS JetStream: agents publish, ingest workers write (issue 26)."""
