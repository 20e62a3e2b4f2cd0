"""Declarative queueing scenarios: a cluster, queues with quotas, running jobs with their facts, a cycle.

    world = World(nodes=fabric(nodes_per_leaf=4), queues=[queue("a", H100=16, cohort="lab")])
    out = world.cycle([job("j1", gpus=8, queue="a")])
    out.expect(placed=["j1"])

`World.cycle` runs one cycle of the fair profile; `Story` keeps committed state across cycles
(placements granted, checkpointed victims released at their deadline and requeued, jobs ending at
their duration hint) for multi-cycle stories.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scenarios.dsl import Held, NodeSpec, build_snapshot

from gangline.core.actions.queueing import (
    PreemptionPlan,
    PreemptionPolicy,
    QueueDecisions,
    RunFacts,
    build_context,
)
from gangline.core.fairshare import UsageHistory
from gangline.core.framework.plan import Plan
from gangline.core.framework.profile import Profile
from gangline.core.model import Job, JobId
from gangline.core.queue_profile import fair_profile, run_queue_cycle
from gangline.core.queues import (
    CohortName,
    CohortSpec,
    QueueName,
    QueueSpec,
    QuotaTree,
    Resource,
    ResourceQuota,
    gpu_resource,
)
from gangline.core.snapshot import Snapshot

H100 = "H100-80GB"


def queue(
    name: str,
    *,
    cohort: str | None = None,
    weight: float = 1.0,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    **nominal: int,
) -> QueueSpec:
    """A queue; quotas by GPU model keyword with '-' written '_' (H100=16 means H100-80GB)."""
    quotas = {
        _model(k): ResourceQuota(v, borrowing_limit=borrowing_limit, lending_limit=lending_limit)
        for k, v in nominal.items()
    }
    return QueueSpec(QueueName(name), quotas, cohort=CohortName(cohort) if cohort else None, weight=weight)


def _model(key: str) -> Resource:
    return gpu_resource(H100 if key == "H100" else key.replace("_", "-"))


@dataclass
class Outcome:
    """One cycle's plan and queueing decisions, with assertions."""

    plan: Plan
    decisions: QueueDecisions

    @property
    def placed(self) -> set[str]:
        return {p.job.id for p in self.plan.placed}

    @property
    def pending(self) -> set[str]:
        return {p.job_id for p in self.plan.pending}

    @property
    def evicted(self) -> set[str]:
        return {e.job_id for e in self.plan.evicted}

    def preemption(self, preemptor: str) -> PreemptionPlan:
        plan = next((p for p in self.decisions.preemptions if p.preemptor == preemptor), None)
        assert plan is not None, f"no preemption plan for {preemptor}: {self.decisions.preemptions}"
        return plan

    def reasons(self, job_id: str) -> list[str]:
        p = self.plan.pending_job(JobId(job_id))
        out = [r.message for r in p.reasons] if p else []
        return out + self.decisions.explanations.get(JobId(job_id), [])

    def expect(self, *, placed: Sequence[str] = (), pending: Sequence[str] = ()) -> Outcome:
        for j in placed:
            assert j in self.placed, f"{j} not placed: {self.reasons(j)}"
        for j in pending:
            assert j not in self.placed, f"{j} was placed"
            assert j in self.pending, f"{j} has no pending record"
        return self


@dataclass
class World:
    """A cluster with queues and running jobs, at time ``now``."""

    nodes: Mapping[str, NodeSpec]
    queues: Sequence[QueueSpec]
    cohorts: Sequence[CohortSpec] = ()
    running: Sequence[Held] = ()
    facts: Mapping[str, RunFacts] = field(default_factory=dict)
    now: float = 0.0
    policy: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    history: UsageHistory | None = None
    in_flight: frozenset[JobId] = frozenset()
    profile: Profile = field(default_factory=fair_profile)

    def snapshot(self) -> Snapshot:
        return build_snapshot(self.nodes, self.running)

    def tree(self) -> QuotaTree:
        return QuotaTree(self.queues, self.cohorts)

    def cycle(
        self,
        jobs: Sequence[Job],
        *,
        submit: Mapping[str, float] | None = None,
        snapshot: Snapshot | None = None,
    ) -> Outcome:
        snap = snapshot if snapshot is not None else self.snapshot()
        submit_time = {JobId(k): v for k, v in (submit or {}).items()}
        for i, j in enumerate(jobs):
            submit_time.setdefault(j.id, float(i))
        ctx = build_context(
            snap,
            self.tree(),
            now=self.now,
            submit_time=submit_time,
            run_facts={JobId(k): v for k, v in self.facts.items()},
            history=self.history,
            policy=self.policy,
            in_flight=self.in_flight,
        )
        plan, decisions = run_queue_cycle(snap, jobs, self.profile, ctx, cycle=1)
        return Outcome(plan, decisions)


@dataclass
class Story:
    """Committed state across cycles: grants, checkpoints at their deadlines, completions, requeues."""

    world: World
    snapshot: Snapshot = field(init=False)
    pending: dict[JobId, Job] = field(default_factory=dict)
    submit: dict[JobId, float] = field(default_factory=dict)
    facts: dict[JobId, RunFacts] = field(default_factory=dict)
    checkpointing: dict[JobId, float] = field(default_factory=dict)
    """Victims being checkpointed → their deadline (they hold GPUs until then)."""
    waiting_for: dict[JobId, float] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    cycles: int = 0

    def __post_init__(self) -> None:
        self.snapshot = self.world.snapshot()
        self.facts = {JobId(k): v for k, v in self.world.facts.items()}

    def submit_job(self, job: Job, at: float) -> None:
        self.pending[job.id] = job
        self.submit[job.id] = at

    def step(self, now: float) -> Outcome:
        """Finish jobs and checkpoints due by ``now``, then run one cycle and commit it."""
        for jid, deadline in sorted(self.checkpointing.items()):
            if deadline <= now:
                r = self.snapshot.release(jid)
                del self.checkpointing[jid]
                if r is not None:
                    self.pending[jid] = r.job
                    self.log.append(f"t={now:g} {jid} checkpointed and requeued")
        for jid in sorted(self.snapshot.running):
            end = self.facts[jid].expected_end if jid in self.facts else None
            if end is not None and end <= now and jid not in self.checkpointing:
                self.snapshot.release(jid)
                self.log.append(f"t={now:g} {jid} completed")
        self.cycles += 1
        world = World(
            nodes=self.world.nodes,
            queues=self.world.queues,
            cohorts=self.world.cohorts,
            now=now,
            policy=self.world.policy,
            facts={},
            in_flight=frozenset(self.checkpointing) | frozenset(self.waiting_for),
            profile=self.world.profile,
        )
        ctx = build_context(
            self.snapshot,
            world.tree(),
            now=now,
            submit_time=self.submit,
            run_facts=self.facts,
            policy=world.policy,
            in_flight=world.in_flight,
        )
        plan, decisions = run_queue_cycle(
            self.snapshot, list(self.pending.values()), world.profile, ctx, cycle=self.cycles
        )
        out = Outcome(plan, decisions)
        for p in plan.placed:
            st = self.snapshot.grant(p.job, p.allocation)
            assert st.ok, st.message
            self.pending.pop(p.job.id, None)
            self.waiting_for.pop(p.job.id, None)
            hint = p.job.duration_hint_s
            self.facts[p.job.id] = RunFacts(now, None, now + hint if hint is not None else None)
            self.log.append(f"t={now:g} {p.job.id} placed")
        for plan_ in decisions.preemptions:
            self.waiting_for[plan_.preemptor] = plan_.ready_at
            for v in plan_.victims:
                self.checkpointing[v.job_id] = v.checkpoint_deadline
                self.log.append(f"t={now:g} {v.job_id} asked to checkpoint by t={v.checkpoint_deadline:g}")
        assert not self.snapshot.check_invariants()
        return out


__all__ = ["H100", "Outcome", "Story", "World", "queue"]
