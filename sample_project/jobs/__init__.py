"""Claiming work: the second reference system (a job table, SKIP LOCKED claims, leases and fencing tokens)."""
