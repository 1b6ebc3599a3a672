"""Advisory locks: the API, their keys, and contention between sessions."""
