"""Benchmarks of the running system (``make bench-e2e``)."""
