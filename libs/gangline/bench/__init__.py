"""Benchmarks (not tests): run as modules, print figures as JSON lines."""
