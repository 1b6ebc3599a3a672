"""The operation layer: locked_operation, its retry policy and its awaitable form."""
