"""The fold's packed retired jobs behave as the dict they replace, through any mix of retirements, updates,
revivals and snapshots (pickled as a snapshot pickles them, and loaded by its restricted unpickler)."""

from __future__ import annotations

import pickle
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gangline.events.types import AllocationId, JobId
from gangline.fold.cluster import ClusterFold
from gangline.fold.retired import PackedIds, RetiredJobs, allocation_id_of
from services.common.snapshots import decode_state, encode_state, load_state

JOBS = st.sampled_from([f"j{k}" for k in range(12)] + ["x" * 127, "a.b-c"])


def released(job: str, draw: st.DrawFn) -> tuple[AllocationId, ...]:
    kind = draw(st.sampled_from(["counted", "counted", "none", "other", "unsorted"]))
    if kind == "none":
        return ()
    if kind == "counted":  # the ids the fold gives a job's grants, sorted as _retire keeps them
        count = draw(st.integers(1, 12))
        return tuple(sorted(allocation_id_of(job, k) for k in range(1, count + 1)))
    if kind == "unsorted":  # as _absorbed_by_retired appends a late release
        return (allocation_id_of(job, 2), allocation_id_of(job, 1))
    return (AllocationId(f"{job}-elsewhere"),)


@st.composite
def operations(draw: st.DrawFn) -> list[tuple[str, str, tuple[AllocationId, ...]]]:
    ops = []
    for _ in range(draw(st.integers(0, 40))):
        op = draw(st.sampled_from(["set", "set", "del", "snapshot"]))
        job = draw(JOBS)
        ops.append((op, job, released(job, draw) if op == "set" else ()))
    return ops


def roundtrip(retired: RetiredJobs) -> RetiredJobs:
    state = ClusterFold()
    state.retired = retired
    fresh = ClusterFold()
    load_state(
        fresh, decode_state(zlib.decompress(zlib.compress(encode_state(state))), ClusterFold.SNAPSHOT_FIELDS)
    )
    assert isinstance(fresh.retired, RetiredJobs)
    return fresh.retired


@settings(max_examples=300, deadline=None)
@given(operations())
def test_packed_retired_jobs_are_the_dict_they_replace_through_snapshots(ops: list) -> None:
    packed, plain = RetiredJobs(), {}
    for op, name, ids in ops:
        job = JobId(name)
        if op == "set":
            packed[job] = plain[job] = ids
        elif op == "del":
            assert (job in packed) == (job in plain)
            if job in plain:
                del packed[job], plain[job]
        else:
            packed = roundtrip(packed)
        assert packed == plain and len(packed) == len(plain) and sorted(packed) == sorted(plain)
    for name in [f"j{k}" for k in range(12)] + ["x" * 127, "a.b-c", "nobody"]:
        job = JobId(name)
        assert (job in packed) == (job in plain)
        assert packed.get(job, ()) == plain.get(job, ())


def test_a_job_with_a_long_id_counts_its_derived_allocation_ids() -> None:
    job = JobId("x" * 127)
    ids = (allocation_id_of(job, 1),)
    assert len(f"{job}.1") > 128 and ids[0] != f"{job}.1"
    packed = RetiredJobs({job: ids})
    assert roundtrip(packed)[job] == ids


def test_a_snapshot_keeps_a_million_counted_jobs_as_one_string_and_a_byte_each() -> None:
    retired = RetiredJobs({JobId(f"job-{k}"): (allocation_id_of(f"job-{k}", 1),) for k in range(1_000)})
    retired[JobId("odd")] = (AllocationId("odd-elsewhere"),)
    saved = retired.__getstate__()
    assert isinstance(saved["ids"], str) and saved["counts"] == b"\x01" * 1_000
    assert isinstance(saved["starts"], bytes) and len(saved["starts"]) == 4 * 1_001
    assert saved["others"] == {"odd": ("odd-elsewhere",)}
    assert pickle.loads(pickle.dumps(retired, protocol=5)) == retired


def test_loaded_they_stay_one_string_and_are_looked_up_in_it() -> None:
    retired = RetiredJobs({JobId(f"job-{k:04d}"): (allocation_id_of(f"job-{k:04d}", 1),) for k in range(500)})
    loaded = pickle.loads(pickle.dumps(retired, protocol=5))
    assert isinstance(loaded._sorted, PackedIds) and len(loaded._sorted) == 500
    assert loaded._sorted[0] == "job-0000" and loaded._sorted[-1] == "job-0499"
    assert loaded.get(JobId("job-0250")) == ("job-0250.1",)
    assert JobId("job-0250x") not in loaded and JobId("job-") not in loaded and JobId("zzz") not in loaded
    del loaded[JobId("job-0001")]
    loaded[JobId("job-0002")] = (AllocationId("job-0002.1"), AllocationId("job-0002.2"))
    again = pickle.loads(pickle.dumps(loaded, protocol=5))
    assert JobId("job-0001") not in again and again[JobId("job-0002")] == ("job-0002.1", "job-0002.2")
    assert len(again) == 499 and dict(again) == dict(loaded)


def test_a_snapshot_of_the_earlier_form_still_loads() -> None:
    earlier = {"jobs": "a\nb", "counts": b"\x01\x02", "others": {}}
    retired = RetiredJobs()
    retired.__setstate__(earlier)
    assert dict(retired) == {"a": ("a.1",), "b": ("b.1", "b.2")}


def test_a_garbled_snapshot_of_them_is_refused() -> None:
    retired = RetiredJobs({JobId("a"): (allocation_id_of("a", 1),)})
    broken = RetiredJobs()
    try:
        broken.__setstate__({**retired.__getstate__(), "counts": b"\x01\x01"})
    except ValueError:
        return
    raise AssertionError("counts that do not match the jobs were accepted")
