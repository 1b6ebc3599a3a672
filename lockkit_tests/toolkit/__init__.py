"""The testing toolkit (lockkit.testing) and its pytest plugin."""
