"""lockkit.claims: the API, its compiled statements, hardening, and contention on every vendor."""
