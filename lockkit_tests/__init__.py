"""lockkit's own test suite: an unshipped Django app run by pytest-django on a real PostgreSQL."""
