"""Actions: the steps of a cycle (allocate here; backfill, preempt, reclaim join them).

Each module exposes `NAME` and a class taking the profile args; `gangline.core.defaults`
registers them explicitly.
"""
