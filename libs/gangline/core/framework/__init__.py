"""The scheduling framework: extension points, statuses, cycle state, registry, profiles, plans.

Modules (import from them directly; this package re-exports nothing so the core has no import
cycles):

* `status`   — `Status` and `Reason`: typed outcomes of every extension point, and explanations.
* `plugin`   — one small Protocol per extension point (pre-filter, filter, score, reserve,
  permit, job order) and the `Action` protocol.
* `state`    — `CycleState` (per job, per cycle scratch) and `Candidate` (a whole-gang proposal).
* `registry` — `Registry`: explicit name → factory maps for plugins and actions.
* `profile`  — `Profile` and `load_profile`: actions and plugins composed by a YAML file.
* `plan`     — `Plan` and its decisions (placed, pending, evicted): what a cycle produces.
* `cycle`    — `Session` and `run_cycle`: one cycle over a snapshot.
"""
