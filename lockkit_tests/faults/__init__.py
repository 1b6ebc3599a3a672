"""Faults on real servers: terminated sessions, cancelled statements, cut COMMIT replies, restarts, PgBouncer."""
