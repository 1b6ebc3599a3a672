"""``lockkit_worker``."""
