"""Fault-injection tooling: a throwaway PostgreSQL cluster, a TCP proxy that cuts replies, session killers.

Used by lockkit's fault tests (lockkit_tests/test_faults_*.py) and by ``python -m sample_project soak``.
Everything here acts on servers this process started itself, never on the machine's own server.
"""
