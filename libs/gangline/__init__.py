"""Gangline: a GPU scheduler and cluster orchestrator whose every decision is an event on Kafka."""

__version__ = "0.1.0"
