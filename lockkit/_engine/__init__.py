"""lockkit's transaction engine (private): the only code that begins, sends and ends a transaction.

It sends a transaction's opening (and, for lockkit's own statements, the whole transaction) as one message, and
decides what became of a transaction whose reply was lost or interrupted. Scopes, operations and features use it;
it uses the vendor backends below it. Nothing here is public API.
"""
