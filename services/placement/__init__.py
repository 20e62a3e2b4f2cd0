"""Placement: holds the cluster state folded from the log and grants GPUs to whole gangs."""
