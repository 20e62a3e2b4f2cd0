"""Replay of the recorded log: JSONL records, the allocations.log hash chain, decision re-runs, what-if."""
