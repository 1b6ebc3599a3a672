"""The documentation's code blocks: each one runs as a test or is marked not runnable."""
