"""Tests of the development harness itself (lockkit_harness): the embedded starter, the soak's schedule and checks."""
