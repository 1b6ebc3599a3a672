"""The contention demo: a flash sale (naive vs guarded vs lockkit) and a job queue with a killed worker."""
