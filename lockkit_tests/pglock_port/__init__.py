"""django-pglock's test suite, ported onto lockkit."""
