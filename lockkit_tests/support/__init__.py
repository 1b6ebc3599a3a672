"""Helpers shared by the test subpackages: vendor parameters, fault aliases, the topology's aliases, workers."""
