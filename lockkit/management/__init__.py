"""lockkit's management commands live in ``commands/``."""
