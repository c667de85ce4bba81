"""Where an input that no output names was lost: before ``mm.features`` or after it.

A fault test that finds inputs neither merged, late nor dead-lettered asks this
before it fails: the features topic is read back from its start, and each lost
input is named with the feature record made from it (then the aligner lost it)
or without one (then its feature agent never read it, or its send was lost).
``where_lost`` is only a diagnostic for an assertion's message; ``feature_inputs``
gives the inputs read back, for a test to assert on. Unless told which inputs to wait
for, the read stops after 2 s without a record (the embedded broker under-reports end
offsets, so there is no end to read to): on a large topic "no feature record" may mean
only that the read stopped before it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.kafka.clients import consume
from app.settings import Settings
from schemas.features import FeatureRecord, ProgressMark, decode_features

__all__ = ["feature_inputs", "where_lost"]

#: at most this many lost inputs are named one by one (the rest counted)
_NAMED = 12


async def feature_inputs(s: Settings, *, until: set[tuple[str, int, int]] | None = None,
                         timeout_s: float = 20.0) -> set[tuple[str, int, int]]:
    """The inputs (modality, input partition, input offset) that ``mm.features`` holds a
    feature record of, read from its start until ``until`` are all found, ``timeout_s``
    passes, or (without ``until``) 2 s pass without a record."""
    found, _ = await _read_features(s, timeout_s, until)
    return set(found)


async def _read_features(s: Settings, timeout_s: float,
                         until: set[tuple[str, int, int]] | None = None
                         ) -> tuple[dict[tuple[str, int, int], list[tuple[int, int]]],
                                    dict[str, int]]:
    found: dict[tuple[str, int, int], list[tuple[int, int]]] = {}
    counts = {"features": 0, "marks": 0, "undecodable": 0}

    def handle(m: Any) -> None:
        try:
            rec = decode_features(m.value)
        except Exception:  # noqa: BLE001 - a diagnostic: count, never raise
            counts["undecodable"] += 1
            return
        if isinstance(rec, ProgressMark):
            counts["marks"] += 1
        elif isinstance(rec, FeatureRecord):
            counts["features"] += 1
            key = (rec.modality, rec.src_partition, rec.src_offset)
            found.setdefault(key, []).append((m.partition, m.offset))

    if until is None:
        await consume(s, [s.topic("features")], handle, timeout_s=timeout_s, idle_polls=10)
    else:
        await consume(s, [s.topic("features")], handle, timeout_s=timeout_s,
                      until=lambda: until.issubset(found))
    return found, counts


async def where_lost(s: Settings, lost: Iterable[tuple[str, int, int]],
                     timeout_s: float = 20.0) -> str:
    """One line per lost input (modality, input partition, input offset): the features
    partition and offset of its feature record, or "no feature record"; then the
    feature records and progress marks the topic held in all."""
    want = sorted(set(lost))
    if not want:
        return "nothing lost"
    try:
        found, counts = await _read_features(s, timeout_s)
    except Exception as exc:  # noqa: BLE001 - the broker may be the fault under test
        return f"features topic not read back: {exc!r}"
    lines = [f"{len(want)} inputs lost; {s.topic('features')} holds {counts['features']} "
             f"feature records, {counts['marks']} progress marks, "
             f"{counts['undecodable']} undecodable"]
    for key in want[:_NAMED]:
        where = found.get(key)
        lines.append(f"  {key}: " + (f"feature record at (partition, offset) {where}: lost "
                                     "in the aligner" if where else
                                     "no feature record: lost before mm.features"))
    if len(want) > _NAMED:
        with_rec = sum(1 for k in want if k in found)
        lines.append(f"  ... {len(want) - _NAMED} more; of all {len(want)}, {with_rec} have "
                     "a feature record")
    return "\n".join(lines)
