"""Advisory locks: keys (keys.py), taking and giving them back on one connection (held.py), advisory_lock() (api.py)."""
