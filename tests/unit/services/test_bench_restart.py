"""The restart benchmark's seeded snapshot holds the state placement's restore of the whole history builds
(services.bench.restart.folded_state), so a restart from it is a restart from the snapshot a placement
that read the whole history would have written."""

from __future__ import annotations

from gangline.events.codec import decode
from services.bench.restart import cluster_registrations, folded_state, history
from services.common.snapshots import decode_state, encode_state
from services.placement.handlers import PlacementState
from services.placement.settings import PlacementSettings
from services.placement.wiring import new_state


def saved(state: PlacementState) -> object:
    return decode_state(encode_state(state), PlacementState.SNAPSHOT_FIELDS)


def test_the_seeded_state_is_the_fold_of_the_whole_history() -> None:
    jobs, live = 300, 20
    registrations = cluster_registrations(4)
    nodes = [node for node, _ in registrations]
    settings = PlacementSettings.from_env({})
    whole = new_state(settings)
    for _, value in registrations:
        whole.restore(decode(value))
    records = list(history(jobs, nodes, live))
    for kind in ("events", "allocations"):  # topic by topic, as the restore reads them
        for _, _, value in (r for r in records if r[0] == kind):
            whole.restore(decode(value))
    assert len(whole.retired) == jobs - live and len(whole.jobs) == live

    seeded = folded_state(jobs, nodes, live, registrations, settings)

    assert saved(seeded) == saved(whole)
    assert [j.core() for j in seeded.waiting.values()] == [j.core() for j in whole.waiting.values()]
