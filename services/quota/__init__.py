"""Quota: keeps each queue's GPU usage from the log and lets admitted jobs through within quota."""
