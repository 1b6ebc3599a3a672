"""The scope layer: one alias, one transaction or savepoint, its timeouts, LockScope and locked()."""
