"""The aligner's whole per-worker state, driven by consumed records (pure: no Faust).

:class:`AlignRunner` takes feature records as they are consumed, with their
partition and offset on the features topic, and returns a :class:`Step`: the
windows to publish, the late events, the dead letters, and the offsets that
may now be acked. The agent (``agents/aligner.py``) only sends what a step
holds and acks what it names.

Acks follow two rules. A record's offset is done once the record is placed:
its window was emitted, or it went late, or to the dead-letter topic, or was a
duplicate. And an offset is released for acking only once every earlier
offset of its partition is done (:class:`app.align.acks.OrderedAcks`), since
Faust commits the acked prefix and would skip held records otherwise.

A record is known by its input (modality, input partition, input offset):
the same input consumed twice while the first copy is still open (a feature
agent that re-processed its input after a crash) is a duplicate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from app.align.acks import OrderedAcks
from app.align.aligner import Aligner, AlignerConfig
from app.consumed import RawMsg, dead_letter
from app.errors import InvalidInputError
from schemas.aligned import AlignedWindow, LateEvent
from schemas.dead_letter import DeadLetter
from schemas.features import FeatureRecord

__all__ = ["AlignRunner", "Source", "Step", "source_of"]

#: An input record's identity: (modality, input partition, input offset).
Source = tuple[str, int, int]


def source_of(rec: FeatureRecord) -> Source:
    return rec.modality, rec.src_partition, rec.src_offset


@dataclass(slots=True)
class Step:
    """What one consumed record (or one timer tick) leads to, in the order to send it."""

    windows: list[AlignedWindow] = field(default_factory=list)
    late: list[LateEvent] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    #: partition -> offsets that may be acked now, in offset order
    acks: dict[int, list[int]] = field(default_factory=dict)
    #: (modality, outcome) per record consumed: merged, late, duplicate, dead_letter
    outcomes: list[tuple[str, str]] = field(default_factory=list)
    #: input record's Kafka timestamp to its window's emission, s, per merged record
    e2e: list[float] = field(default_factory=list)

    def release(self, partition: int, offsets: list[int]) -> None:
        if offsets:
            self.acks.setdefault(partition, []).extend(offsets)


class AlignRunner:
    """Feature records in (with their position), windows and acks out."""

    def __init__(self, cfg: AlignerConfig, topic: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.aligner = Aligner(cfg)
        self.topic = topic
        self._clock = clock
        self._acks = OrderedAcks()
        #: source of every record placed in an open window -> its (partition, offset)
        self._held: dict[Source, tuple[int, int]] = {}
        #: stream_id -> partition of the features topic it arrives on
        self._partition_of: dict[str, int] = {}

    # -- input -------------------------------------------------------------
    def on_record(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                  now: float) -> Step:
        """One consumed feature record, ``now`` the wall-clock time it arrived (s)."""
        step = Step()
        self._acks.hold(partition, offset)
        try:
            rec = FeatureRecord.decode(value)
        except InvalidInputError as exc:
            raw = RawMsg(topic=self.topic, partition=partition, offset=offset, key=key,
                         value=value, timestamp_ms=0)
            step.dead.append(dead_letter(raw, exc.reason, exc.detail))
            step.outcomes.append(("features", "dead_letter"))
            step.release(partition, self._acks.done(partition, offset))
            return step
        self._partition_of[rec.stream_id] = partition
        src = source_of(rec)
        outcome = "duplicate" if src in self._held else None
        if outcome is None:
            res = self.aligner.add(rec, now)
            outcome = res.outcome
            if res.late is not None:
                step.late.append(res.late)
        step.outcomes.append((rec.modality, outcome))
        if outcome == "merged":
            self._held[src] = (partition, offset)
        else:
            step.release(partition, self._acks.done(partition, offset))
        self._emit(step, [rec.stream_id], now)
        return step

    def on_tick(self, now: float) -> Step:
        """Close what the watermark passed in any stream (idle streams included)."""
        step = Step()
        self._emit(step, None, now)
        return step

    # -- output ------------------------------------------------------------
    def _emit(self, step: Step, stream_ids: list[str] | None, arrived: float) -> None:
        for sid, start, recs in self.aligner.poll(arrived, stream_ids):
            t0 = time.perf_counter()
            emitted = self._clock()
            win = self.aligner.window(sid, start, recs, emitted_at=int(emitted * 1_000_000))
            e2e = [max(0.0, emitted - r.kafka_ts_ms / 1e3) for r in recs if r.kafka_ts_ms > 0]
            if e2e:
                win.stages["e2e_max"] = max(e2e)
                win.stages["e2e_mean"] = sum(e2e) / len(e2e)
            win.stages["align"] = time.perf_counter() - t0
            # arrival of the record (or tick) that closed it to its emission, s
            win.stages["sync"] = max(0.0, self._clock() - arrived)
            step.windows.append(win)
            step.e2e.extend(e2e)
            for rec in recs:
                where = self._held.pop(source_of(rec), None)
                if where is not None:
                    step.release(where[0], self._acks.done(*where))

    # -- partitions and streams ----------------------------------------------
    def revoke(self, partitions: Iterable[int]) -> list[str]:
        """Forget the streams of revoked features partitions and their held offsets: the
        new owner replays them (they were never acked). Returns the streams dropped."""
        gone = set(partitions)
        sids = [sid for sid, p in self._partition_of.items() if p in gone]
        for sid in sids:
            st = self.aligner.streams.get(sid)
            for rec in st.pending if st is not None else ():
                self._held.pop(source_of(rec), None)
            self._partition_of.pop(sid, None)
        self.aligner.forget(sids)
        self._acks.drop(gone)
        return sids

    def evict_idle(self, now: float) -> list[str]:
        """Forget streams idle past the stream TTL (``Aligner.evict_idle``)."""
        gone = self.aligner.evict_idle(now)
        for sid in gone:
            self._partition_of.pop(sid, None)
        return gone

    def open_records(self) -> int:
        return self.aligner.open_records()

    def waiting_acks(self) -> int:
        return self._acks.waiting()
