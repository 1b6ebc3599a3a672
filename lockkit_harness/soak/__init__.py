"""``python -m sample_project soak``: the sample project's services under faults, for minutes, reconciled.

Worker processes run the inventory and job services as the docs recommend (no recovery code of their own) against
a PostgreSQL cluster the soak starts for itself; a schedule of faults (killed workers, terminated sessions,
cancelled statements, server restarts, COMMIT replies cut by a proxy) runs meanwhile; at the end every
acknowledged outcome in the workers' logs is reconciled against the database. See docs/reliability.md.
"""
