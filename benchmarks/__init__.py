"""lockkit's benchmark suite: lockkit next to hand-written Django code and to pgbench, on one PostgreSQL server.

Run ``python -m benchmarks`` (``--help`` for options). Not shipped in the wheel; nothing here asserts a speed.
"""
