"""The fold's retired jobs, packed: what is kept of every finished job whose grants were all released.

A cluster's history is mostly retired jobs (a million after a busy year), and all the fold keeps of one is
its released allocation ids, so that a record about it read again changes nothing. Nearly every job's are
the ids the fold gives its grants in order (``<job>.1``, ``<job>.2``, …: :func:`allocation_id_of`), so for
those only their number is kept; any other set of ids is kept as it is. Read back, the map gives the same
tuples it was given.

Layout. Jobs retired before the latest snapshot are a sorted sequence of ids with one byte each (how
many grants), looked up by bisection. The ids are one string, with where each starts (:class:`PackedIds`):
a snapshot saves the string, the starts and the counts as three flat values, and loading them makes no
object per job (not a million dict insertions, which alone cost half a second of CPU, nor a million
strings from a split, which cost a tenth of one and 60 MB, and that every full collection then walks).
Jobs retired since are in a dict; a snapshot merges them into the sorted part
(:meth:`RetiredJobs.__getstate__`).
"""

from __future__ import annotations

import bisect
import sys
from array import array
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from itertools import accumulate
from typing import Any, cast, overload

from gangline.events.ids import derived_id
from gangline.events.types import AllocationId, JobId

MAX_ALLOCATION_ID = 128
_MAX_COUNTED = 255
"""Jobs with more grants than a byte counts are kept as they are."""
_SEPARATOR = "\n"
"""Between the job ids of a snapshot (an id is ``SAFE_ID_PATTERN``: never a newline)."""


def allocation_id_of(job_id: str, attempt: int) -> AllocationId:
    """The id the fold gives a job's ``attempt``-th grant (1-based)."""
    candidate = f"{job_id}.{attempt}"
    if len(candidate) <= MAX_ALLOCATION_ID:
        return AllocationId(candidate)
    return AllocationId(derived_id(job_id, "allocation", attempt))


def _counted(job_id: str, count: int) -> tuple[AllocationId, ...]:
    """The ids of a job's first ``count`` grants, sorted (as the fold keeps a retired job's)."""
    return tuple(sorted(allocation_id_of(job_id, k) for k in range(1, count + 1)))


_STARTS = "I"
"""The starts' item type: 4 bytes, so a string of ids up to 4 GiB (a larger one is saved without them)."""


class PackedIds(Sequence[JobId]):
    """Sorted job ids as one string (``_SEPARATOR`` after each) and the offset where each starts, read by
    position: bisection works on it as on a list, and building it makes two objects, not one per id."""

    __slots__ = ("_starts", "_text")

    def __init__(self, text: str, starts: array[int]) -> None:
        self._text = text
        self._starts = starts
        """Where each id begins, and one more entry: the end of the text."""

    @classmethod
    def of(cls, ids: Sequence[str]) -> PackedIds:
        text = "".join(f"{job}{_SEPARATOR}" for job in ids)
        return cls(text, array(_STARTS, accumulate((len(job) + 1 for job in ids), initial=0)))

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> JobId: ...
    @overload
    def __getitem__(self, index: slice) -> list[JobId]: ...
    def __getitem__(self, index: int | slice) -> JobId | list[JobId]:
        if isinstance(index, slice):
            return list(self)[index]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        starts = self._starts
        return JobId(self._text[starts[index] : starts[index + 1] - 1])

    def __iter__(self) -> Iterator[JobId]:
        return iter(cast("list[JobId]", self._text.split(_SEPARATOR)[:-1]))

    def saved(self) -> tuple[str, bytes | None]:
        """The text, and the starts as little-endian bytes (None when the text is too long for them)."""
        starts = array(_STARTS, self._starts)
        if self._starts[-1] >= 2 ** (8 * starts.itemsize):
            return self._text, None
        if sys.byteorder == "big":
            starts.byteswap()
        return self._text, starts.tobytes()

    @classmethod
    def loaded(cls, text: str, starts: bytes) -> PackedIds:
        found = array(_STARTS)
        found.frombytes(starts)
        if sys.byteorder == "big":
            found.byteswap()
        if not found or found[0] != 0 or found[-1] != len(text):
            raise ValueError("a snapshot's retired job ids and their starts disagree")
        return cls(text, found)


class RetiredJobs(MutableMapping[JobId, tuple[AllocationId, ...]]):
    """Retired job → its released allocation ids (module docstring). Equal to any mapping with the same
    items, a ``dict`` included. A job is in exactly one of: the sorted part (and not ``_gone``), the
    counted dict, the others dict."""

    __slots__ = ("_counts", "_gone", "_others", "_sorted", "_sorted_counts")

    def __init__(self, items: Mapping[JobId, tuple[AllocationId, ...]] | None = None) -> None:
        self._sorted: Sequence[JobId] = []
        """Jobs retired before the latest snapshot whose ids are counted, sorted (packed once loaded or
        merged)."""
        self._sorted_counts = b""
        """Their counts, position by position."""
        self._gone: set[JobId] = set()
        """Jobs of the sorted part deleted since (or moved to one of the dicts)."""
        self._counts: dict[JobId, int] = {}
        """Jobs retired since, whose released ids are their first n grants' (:func:`_counted`): n."""
        self._others: dict[JobId, tuple[AllocationId, ...]] = {}
        """Every other job, with its ids as given."""
        for job, released in (items or {}).items():
            self[job] = released

    def _sorted_count(self, job: object) -> int | None:
        """The count of ``job`` in the sorted part (None: not there, or gone)."""
        keys = self._sorted
        at: int = bisect.bisect_left(keys, job)  # type: ignore[call-overload]  # any object may be asked about
        if at < len(keys) and keys[at] == job and job not in self._gone:
            return self._sorted_counts[at]
        return None

    def __contains__(self, job: object) -> bool:
        if job in self._counts or job in self._others:
            return True
        return isinstance(job, str) and self._sorted_count(job) is not None

    def get(self, job: JobId, default: Any = None) -> Any:
        count = self._counts.get(job)
        if count is None and job not in self._others:
            count = self._sorted_count(job)
        if count is not None:
            return _counted(job, count)
        return self._others.get(job, default)

    def __getitem__(self, job: JobId) -> tuple[AllocationId, ...]:
        found: tuple[AllocationId, ...] | None = self.get(job)
        if found is None:
            raise KeyError(job)
        return found

    def __setitem__(self, job: JobId, released: tuple[AllocationId, ...]) -> None:
        if self._sorted_count(job) is not None:
            self._gone.add(job)
        count = len(released)
        if count <= _MAX_COUNTED and released == _counted(job, count):
            self._counts[job] = count
            self._others.pop(job, None)
        else:
            self._others[job] = released
            self._counts.pop(job, None)

    def __delitem__(self, job: JobId) -> None:
        if self._counts.pop(job, None) is not None or self._others.pop(job, None) is not None:
            return
        if self._sorted_count(job) is None:
            raise KeyError(job)
        self._gone.add(job)

    def __iter__(self) -> Iterator[JobId]:
        gone = self._gone
        yield from (job for job in self._sorted if job not in gone) if gone else self._sorted
        yield from self._counts
        yield from self._others

    def __len__(self) -> int:
        return len(self._sorted) - len(self._gone) + len(self._counts) + len(self._others)

    def __repr__(self) -> str:
        return f"RetiredJobs({len(self)} jobs)"

    def _merge(self) -> None:
        """Fold the counted jobs retired since into the sorted part (and drop the gone ones from it)."""
        keys, counts = list(self._sorted), self._sorted_counts
        if self._gone:
            gone = self._gone
            kept = [k for k, job in enumerate(keys) if job not in gone]
            keys, counts = [keys[k] for k in kept], bytes(counts[k] for k in kept)
            self._gone = set()
        if len(self._counts) > len(keys) // 16:  # many (a first snapshot after a rebuild): sort them all
            merged = dict(zip(keys, counts, strict=True))
            merged.update(self._counts)
            keys = sorted(merged)
            counts = bytes(map(merged.__getitem__, keys))
            self._counts = {}
        elif self._counts:
            new_keys: list[JobId] = []
            new_counts = bytearray()
            start = 0
            for job in sorted(self._counts):  # splice each in where it sorts: slices, not a full re-sort
                at = bisect.bisect_left(keys, job, start)
                new_keys += keys[start:at]
                new_counts += counts[start:at]
                new_keys.append(job)
                new_counts.append(self._counts[job])
                start = at
            new_keys += keys[start:]
            new_counts += counts[start:]
            keys, counts = new_keys, bytes(new_counts)
            self._counts = {}
        self._sorted, self._sorted_counts = PackedIds.of(keys), counts

    def __getstate__(self) -> dict[str, object]:
        """The snapshot's form: the counted jobs' ids, sorted, in one string (each followed by the
        separator), where each starts, and their counts in one byte each; the others as they are."""
        self._merge()
        packed = self._sorted if isinstance(self._sorted, PackedIds) else PackedIds.of(self._sorted)
        text, starts = packed.saved()
        saved: dict[str, object] = {"ids": text, "counts": self._sorted_counts, "others": self._others}
        if starts is not None:
            saved["starts"] = starts
        return saved

    def __setstate__(self, saved: dict[str, Any]) -> None:
        counts: bytes = saved["counts"]
        if "jobs" in saved:  # the form before the starts were saved: the ids joined by the separator
            jobs: str = saved["jobs"]
            self._sorted = cast("list[JobId]", jobs.split(_SEPARATOR)) if counts else []
        elif "starts" in saved:
            self._sorted = PackedIds.loaded(saved["ids"], saved["starts"])
        else:  # too long for the starts: each id followed by the separator
            self._sorted = cast("list[JobId]", saved["ids"].split(_SEPARATOR)[:-1])
        self._sorted_counts = bytes(counts)
        if len(self._sorted) != len(self._sorted_counts):
            raise ValueError("a snapshot's retired jobs and their counts differ in number")
        self._gone = set()
        self._counts = {}
        self._others = dict(saved["others"])
