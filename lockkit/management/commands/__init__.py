"""``manage.py lockkit_capabilities``."""
