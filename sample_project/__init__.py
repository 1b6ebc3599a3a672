"""A runnable Django project showing lockkit at work: stock reservation, a job queue, and a contention demo.

Run ``python -m sample_project demo`` from the repository root; see docs/sample_project.md.
"""
