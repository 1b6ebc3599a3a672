"""Topologies of servers the tests start themselves: a hot standby behind a router, PgBouncer in transaction mode."""
