"""The quota gate: fair order over waiting jobs, each let through on the first flavour its queue's quota
admits, held jobs skipped (smaller ones behind go), why a job waits, and where a stranded job moves."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gangline.core.fairshare import FairShare, Pending, UsageHistory
from gangline.core.framework.status import Reason, ReasonCode
from gangline.core.hardware import GpuOffer, Hardware, NodeOffer, WorkerAsk
from gangline.core.model import GpuMode, GpuModel, MiB, QueueName
from gangline.core.queues import (
    CohortName,
    CohortSpec,
    QueueSpec,
    QuotaLedger,
    QuotaTree,
    Resource,
    ResourceQuota,
)
from gangline.core.quota_gate import (
    Flavour,
    Gate,
    HoldReason,
    WaitingLines,
    fair_admission,
    first_fit,
    held_flavours,
    hold_reason,
    let_through,
    reason_key,
    stranded_move,
)

H100 = "H100"
GB200 = "GB200"
A = QueueName("team-a")
B = QueueName("team-b")


def tree(nominal_a: int = 8, nominal_b: int = 8, *, gb200: int = 0, borrow: int | None = None) -> QuotaTree:
    def quotas(n: int) -> dict[Resource, ResourceQuota]:
        out = {Resource(H100): ResourceQuota(n, borrowing_limit=borrow)}
        if gb200:
            out[Resource(GB200)] = ResourceQuota(gb200)
        return out

    lab = CohortName("lab")
    return QuotaTree([QueueSpec(A, quotas(nominal_a), lab), QueueSpec(B, quotas(nominal_b), lab)])


def fair(t: QuotaTree) -> FairShare:
    return FairShare(
        capacity={r: t.total_nominal(r) for r in t.resources},
        weights={q: 1.0 for q in t.queue_names()},
        allocation={},
    )


def gpus(n: int, model: str = H100) -> Flavour:
    return Flavour(model, {Resource(model): n})


def node(model: str, count: int, memory: int = 81920) -> NodeOffer:
    return NodeOffer(
        tuple(GpuOffer(GpuModel(model), MiB(memory), GpuMode.WHOLE) for _ in range(count)), "", "l", "s"
    )


def job(name: str, queue: QueueName = A, *, priority: int = 0, at: float = 0.0) -> Pending[str]:
    return Pending(queue, priority, at, name, name)


def test_jobs_go_in_fair_order_while_they_fit_and_a_held_one_lets_smaller_ones_behind_it_go() -> None:
    t = tree(8, 8, borrow=0)
    ledger = QuotaLedger(t)
    sizes = {"a-big": 12, "a-small": 4, "a-four": 4, "b-one": 8, "b-two": 1}
    waiting = [
        job("a-big", at=0),
        job("a-small", at=1),
        job("a-four", at=2),
        job("b-one", B, at=0),
        job("b-two", B, at=1),
    ]

    gate = let_through(waiting, ledger, fair(t), t, lambda j: ([gpus(sizes[j])], []), explain=1)

    # Equal shares: the earlier admitted first; then the queue with the smaller share.
    assert [(j, f.model) for j, f in gate.admitted] == [("b-one", H100), ("a-small", H100), ("a-four", H100)]
    [(held, why)] = gate.held  # only the first held job is explained; the other is counted
    assert held == "a-big" and gate.unexplained == 1
    assert why.constraint == "quota" and "team-a uses 8 of its 8 H100" in why.message
    assert ledger.usage(A, Resource(H100)) == 8 and ledger.usage(B, Resource(H100)) == 8


def test_priority_goes_first_whatever_the_share() -> None:
    t = tree(4, 4, borrow=0)
    waiting = [job("low", at=0), job("high", priority=5, at=9)]
    order = [j for j, _ in fair_admission(waiting, QuotaLedger(t), fair(t), lambda j: [gpus(4)])]
    assert order == ["high", "low"]


def test_the_first_flavour_quota_admits_is_charged() -> None:
    t = tree(8, 8, gb200=4, borrow=0)
    ledger = QuotaLedger(t)
    ledger.admit(A, {Resource(H100): 8})
    assert first_fit(ledger, A, [gpus(4), gpus(4, GB200)]) == gpus(4, GB200)
    assert first_fit(ledger, A, [gpus(9, GB200)]) is None  # more than the cohort's 8


def test_only_flavours_whose_nodes_can_hold_the_workers_are_kept_and_the_others_say_why() -> None:
    hardware = Hardware(
        [
            NodeOffer(
                tuple(GpuOffer(GpuModel(H100), MiB(81920), GpuMode.WHOLE) for _ in range(8)), "", "l", "s"
            ),
            NodeOffer(
                tuple(GpuOffer(GpuModel(GB200), MiB(190000), GpuMode.WHOLE) for _ in range(4)), "", "l", "s"
            ),
        ]
    )
    ask = WorkerAsk(workers=1, gpus=8)
    fits, misfits = held_flavours(hardware, ask, [gpus(8), gpus(8, GB200)])
    assert fits == [gpus(8)]
    assert [r.code for r in misfits] == [ReasonCode.GANG_SIZE] and misfits[0].details["gpu_type"] == GB200
    # Nothing registered yet: every flavour is kept.
    assert held_flavours(None, ask, [gpus(8), gpus(8, GB200)]) == ([gpus(8), gpus(8, GB200)], [])


def test_a_held_job_is_told_whether_its_queue_is_owed_the_quota_it_waits_for() -> None:
    t = tree(8, 8)
    ledger = QuotaLedger(t)
    ledger.admit(B, {Resource(H100): 16})  # team-b borrows all of team-a's quota

    owed = hold_reason(A, [gpus(4)], [], ledger, t, fair(t))
    assert (owed.code, owed.constraint, owed.owed) == ("quota", "reclaim", True)
    assert (
        owed.details["used"] == 0 and owed.details["nominal"] == 8 and owed.details["within_nominal"] is True
    )

    over = hold_reason(B, [gpus(4)], [], ledger, t, fair(t))
    assert (over.constraint, over.owed) == ("quota", False)
    assert "team-b uses 16 of its 8 H100" in over.message


def test_a_job_no_model_can_hold_is_told_so() -> None:
    hardware = Hardware(
        [
            NodeOffer(
                tuple(GpuOffer(GpuModel(GB200), MiB(190000), GpuMode.WHOLE) for _ in range(4)), "", "l", "s"
            )
        ]
    )
    fits, misfits = held_flavours(hardware, WorkerAsk(workers=1, gpus=8), [gpus(8, GB200)])
    t = tree(gb200=8)
    why = hold_reason(A, fits, misfits, QuotaLedger(t), t, fair(t))
    assert (why.code, why.constraint) == ("gang_size", "hardware") and why.details["largest_node"] == 4


def test_a_stranded_job_moves_to_the_first_other_flavour_with_room_counting_its_own_charge_as_free() -> None:
    t = tree(8, 8, gb200=4, borrow=0)
    ledger = QuotaLedger(t)
    ledger.admit(A, {Resource(H100): 4})  # the stranded job's own charge
    assert stranded_move(A, gpus(4), [gpus(4), gpus(4, GB200)], ledger) == gpus(4, GB200)
    ledger.admit(B, {Resource(GB200): 6})  # the cohort's 8 GB200: 2 left
    assert stranded_move(A, gpus(4), [gpus(4, GB200)], ledger) is None
    assert ledger.usage(A, Resource(H100)) == 4  # the caller's ledger is left as it was


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([A, B]), st.integers(0, 2), st.integers(1, 10)),
        min_size=1,
        max_size=25,
    )
)
def test_the_gate_never_goes_over_quota_and_holds_only_what_does_not_fit(
    raw: list[tuple[QueueName, int, int]],
) -> None:
    t = tree(8, 6, borrow=2)
    ledger = QuotaLedger(t)
    sizes = {f"j{k}": n for k, (_, _, n) in enumerate(raw)}
    waiting = [job(f"j{k}", q, priority=p, at=float(k)) for k, (q, p, _) in enumerate(raw)]

    gate = let_through(waiting, ledger, fair(t), t, lambda j: ([gpus(sizes[j])], []))

    for q in (A, B):
        assert ledger.available(q, Resource(H100)) >= 0
        assert ledger.usage(q, Resource(H100)) <= t.nominal(q, Resource(H100)) + 2
    queue_of = {p.item: p.queue for p in waiting}
    for held, why in gate.held:  # a held job does not fit even now, after all the others were charged
        assert not ledger.fits(queue_of[held], {Resource(H100): sizes[held]})
        assert why.code == "quota"
    assert gate.unexplained == 0
    assert sorted([j for j, _ in gate.admitted] + [j for j, _ in gate.held]) == sorted(sizes)


def test_a_flavour_that_charges_nothing_always_fits() -> None:
    t = tree()
    assert first_fit(QuotaLedger(t), QueueName("not-configured"), [Flavour(None, {})]) == Flavour(None, {})


MISFITS = [
    Reason(ReasonCode.GANG_SIZE, "hardware", "no node holds 8 GPUs", {"gpu_type": GB200, "largest_node": 4}),
    Reason(ReasonCode.GANG_SIZE, "hardware", "no node holds 8 GPUs", {"gpu_type": GB200, "largest_node": 2}),
    Reason(ReasonCode.MEMORY, "hardware", "too little memory", {"gpu_type": H100}),
]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B]),
            st.integers(0, 1),
            st.lists(st.tuples(st.sampled_from([H100, GB200]), st.integers(1, 9)), max_size=2),
            st.lists(st.integers(0, len(MISFITS) - 1), max_size=2),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 12),
)
def test_every_held_job_gets_the_reason_a_fresh_computation_gives_it(
    raw: list[tuple[QueueName, int, list[tuple[str, int]], list[int]]], usage: int
) -> None:
    # let_through works a reason out once per (queue, flavours, misfits) within a pass: each held job's
    # must be the one hold_reason gives it alone, against what is charged once the pass is over.
    t = tree(8, 6, gb200=4, borrow=3)
    ledger = QuotaLedger(t)
    ledger.admit(B, {Resource(H100): usage})
    share = fair(t)
    options = {
        f"j{k}": ([gpus(n, model) for model, n in flavours], [MISFITS[m] for m in misfits])
        for k, (_, _, flavours, misfits) in enumerate(raw)
    }
    for name, (flavours, misfits) in options.items():
        if not flavours and not misfits:  # a job always has a flavour or a reason none fits
            options[name] = ([], [MISFITS[0]])
    waiting = [job(f"j{k}", q, priority=p, at=float(k)) for k, (q, p, _, _) in enumerate(raw)]

    gate = let_through(waiting, ledger, share, t, lambda j: options[j])

    queue_of = {p.item: p.queue for p in waiting}
    for held, why in gate.held:
        flavours, misfits = options[held]
        assert why == hold_reason(queue_of[held], flavours, misfits, ledger, t, share)


def test_the_reason_key_tells_apart_whatever_a_reason_says() -> None:
    base = reason_key(A, [gpus(4), gpus(4, GB200)], [])
    assert reason_key(A, [gpus(4), gpus(4, GB200)], []) == base
    assert reason_key(B, [gpus(4), gpus(4, GB200)], []) != base
    assert reason_key(A, [gpus(4, GB200), gpus(4)], []) != base  # the order shows in the sentence
    assert reason_key(A, [gpus(5), gpus(4, GB200)], []) != base
    assert reason_key(A, [gpus(4), gpus(4, GB200)], MISFITS[:1]) != base
    assert reason_key(A, [gpus(4)], MISFITS[:1]) != reason_key(A, [gpus(4)], MISFITS[1:2])


# -- the lines kept from pass to pass ----------------------------------------------------------------

C, D = QueueName("team-c"), QueueName("team-d")


def nested_tree(borrow: int | None, lend: int | None) -> QuotaTree:
    """Two cohorts under one root, with limits: what each queue may take depends on all the others."""
    top, left, right = CohortName("top"), CohortName("left"), CohortName("right")

    def quotas(h100: int, gb200: int) -> dict[Resource, ResourceQuota]:
        return {
            Resource(H100): ResourceQuota(h100, borrowing_limit=borrow, lending_limit=lend),
            Resource(GB200): ResourceQuota(gb200),
            Resource(f"{H100}/slice"): ResourceQuota(2),
            Resource(f"{GB200}/slice"): ResourceQuota(1, lending_limit=0),
        }

    return QuotaTree(
        [
            QueueSpec(A, quotas(6, 2), left),
            QueueSpec(B, quotas(4, 0), left, weight=2.0),
            QueueSpec(C, quotas(3, 4), right),
            QueueSpec(D, {}, right),
        ],
        [
            CohortSpec(top, quotas={Resource(H100): ResourceQuota(2)}),
            CohortSpec(left, parent=top),
            CohortSpec(right, parent=top),
        ],
    )


def fresh_gate(
    waiting: list[Pending[str]],
    ledger: QuotaLedger,
    share: FairShare,
    t: QuotaTree,
    options: dict[str, tuple[list[Flavour], list[Reason]]],
    explain: int | None,
    aged_before: float | None = None,
) -> Gate[str]:
    """The gate as the plain fair order computes it: each job in turn, the first ``explain`` held told why."""
    gate: Gate[str] = Gate()
    held = []
    for item, fit in fair_admission(waiting, ledger, share, lambda j: options[j][0], aged_before=aged_before):
        if fit is None:
            held.append(item)
        else:
            gate.admitted.append((item, fit))
    queue_of = {p.item: p.queue for p in waiting}
    told = held if explain is None else held[:explain]
    for item in told:
        flavours, misfits = options[item]
        why: HoldReason = hold_reason(queue_of[item], flavours, misfits, ledger, t, share)
        gate.held.append((item, why))
    gate.unexplained = len(held) - len(told)
    return gate


def flavour(model: str, gpus: int, slices: int | None) -> Flavour:
    """``gpus`` of ``model``, and as many ``slices`` of its second resource (a vector request)."""
    request = {Resource(model): gpus}
    if slices:
        request[Resource(f"{model}/slice")] = slices
    return Flavour(model, request)


FLAVOURS = st.lists(
    st.tuples(
        st.sampled_from([H100, GB200]),
        st.integers(1, 9),
        st.one_of(st.none(), st.integers(1, 3)),  # a second resource (MIG-like), charged along
    ),
    max_size=2,
)
JOB = st.tuples(
    st.sampled_from([A, B, C, D]),
    st.integers(0, 2),  # priority
    st.integers(0, 5),  # submit time: ties broken by id
    FLAVOURS,
    st.sampled_from([0.0, 1.0, 2.0, math.inf]),  # the work its line orders it by (line_order)
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 24), JOB),
            st.tuples(st.just("discard"), st.integers(0, 24), st.none()),
            st.tuples(st.just("pass"), st.one_of(st.none(), st.integers(0, 6)), st.none()),
        ),
        min_size=1,
        max_size=60,
    ),
    st.one_of(st.none(), st.integers(0, 3)),
    st.one_of(st.none(), st.integers(0, 4)),
    st.lists(st.tuples(st.sampled_from([A, B, C]), st.integers(0, 6)), max_size=4),
    st.floats(0.0, 6.0),
    st.one_of(st.none(), st.integers(-1, 5)),
)
def test_lines_kept_across_changes_decide_every_pass_as_the_plain_fair_order_over_the_jobs_waiting_then(
    steps: list[
        tuple[str, int | None, tuple[QueueName, int, int, list[tuple[str, int, int | None]], float] | None]
    ],
    borrow: int | None,
    lend: int | None,
    used: list[tuple[QueueName, int]],
    decayed: float,
    aged: int | None,
) -> None:
    # The lines a caller keeps (jobs put, put again with other facts, taken away) must let through the
    # same jobs in the same order on the same flavours, and explain the same first held jobs with the
    # same reasons, as the plain fair order over a fresh list of the jobs waiting at that moment.
    t = nested_tree(borrow, lend)
    base = QuotaLedger(t)
    for q, n in used:
        if base.fits(q, {Resource(H100): n}):
            base.admit(q, {Resource(H100): n})
    capacity = {r: t.total_nominal(r) for r in t.resources}
    weights = {q: t.weight(q) for q in t.queue_names()}
    history = UsageHistory(as_of=0.0, decayed={B: {Resource(H100): decayed}, C: {Resource(GB200): decayed}})

    def share() -> FairShare:
        allocation = {q: base.usage_vector(q) for q in t.queue_names()}
        return FairShare(capacity=capacity, weights=weights, allocation=allocation, history=history)

    lines: WaitingLines[str] = WaitingLines()
    waiting: dict[str, Pending[str]] = {}
    options: dict[str, tuple[list[Flavour], list[Reason]]] = {}
    for op, arg, spec in steps:
        if op == "put":
            assert arg is not None and spec is not None
            name = f"j{arg}"
            queue, priority, at, raw, work = spec
            flavours = [flavour(m, n, x) for m, n, x in raw]
            options[name] = (flavours, [] if flavours else [MISFITS[0]])
            waiting[name] = Pending(queue, priority, float(at), name, name, work)
            lines.put(waiting[name], flavours)
        elif op == "discard":
            name = f"j{arg}"
            waiting.pop(name, None)
            lines.discard(name)
        else:
            explain = arg
            assert len(lines) == len(waiting)
            kept_ledger, fresh_ledger = base.copy(), base.copy()
            kept_share, fresh_share = share(), share()
            aged_before = None if aged is None else float(aged)  # jobs submitted by then starve
            kept = lines.let_through(
                kept_ledger, kept_share, t, lambda j: options[j], explain=explain, aged_before=aged_before
            )
            fresh = fresh_gate(
                list(waiting.values()), fresh_ledger, fresh_share, t, options, explain, aged_before
            )
            assert kept.admitted == fresh.admitted
            assert kept.admitted_ties == [item for item, _ in kept.admitted]  # each job's id is its item
            assert kept.held == fresh.held
            assert kept.unexplained == fresh.unexplained
            for q in t.queue_names():
                assert kept_ledger.usage_vector(q) == fresh_ledger.usage_vector(q)
                assert kept_share.share(q) == fresh_share.share(q)
            # A pass leaves the lines as they were: the same pass again decides the same.
            again = lines.let_through(
                base.copy(), share(), t, lambda j: options[j], explain=explain, aged_before=aged_before
            )
            assert again.admitted == kept.admitted and again.held == kept.held
