"""lockkit's locking core: scopes, options, retries, classification, composition, imports, hostile inputs."""
