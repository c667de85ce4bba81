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

A record is known by its input (modality, input partition, input offset).
The same input consumed twice is a duplicate: while the first copy is open,
or once it was placed (per stream, modality and input partition, every offset
up to the highest placed one was placed: a feature agent processes its input
in order, so what it sends again after a crash repeats a prefix).

Progress marks (``schemas.features.ProgressMark``) update the
:class:`app.align.progress.MarkBoard` that tells a slow modality from an idle
one. After a takeover, :meth:`AlignRunner.restore` loads what the outputs
(``mm.aligned``, ``mm.late``) already hold for a features partition: replayed
records found there are duplicates (acked, never emitted again), each stream's
emitted-until and skew estimate come back, and the other replayed records
join the oldest window still open instead of going late.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.align.acks import OrderedAcks
from app.align.aligner import Aligner, AlignerConfig
from app.align.progress import MarkBoard
from app.consumed import RawMsg, dead_letter
from app.errors import InvalidInputError
from schemas.aligned import AlignedWindow, LateEvent
from schemas.dead_letter import DeadLetter
from schemas.features import FeatureRecord, ProgressMark, decode_features

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
                 clock: Callable[[], float] = time.time, *,
                 marks: MarkBoard | None = None) -> None:
        #: None: no progress marks (silence alone decides idleness, app.align.progress)
        self.marks = marks
        self.aligner = Aligner(cfg, marks)
        self.topic = topic
        self._clock = clock
        self._acks = OrderedAcks()
        #: source of every record placed in an open window -> its (partition, offset)
        self._held: dict[Source, tuple[int, int]] = {}
        #: stream_id -> partition of the features topic it arrives on
        self._partition_of: dict[str, int] = {}
        #: (stream, modality, input partition) -> highest input offset placed
        self._placed: dict[tuple[str, str, int], int] = {}
        #: features partition -> sources the outputs already hold (restore)
        self._restored: dict[int, set[Source]] = {}
        #: features partition -> wall ms of its restore: a record made before it is a replay
        self._replay_before_ms: dict[int, int] = {}
        #: features partition -> how often it was revoked (:meth:`epoch`)
        self._epochs: dict[int, int] = {}

    # -- input -------------------------------------------------------------
    def epoch(self, partition: int) -> int:
        """How often ``partition`` was revoked: taken when a record is consumed and given
        back to :meth:`on_record`, it tells a record consumed before a revoke."""
        return self._epochs.get(partition, 0)

    def on_record(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                  now: float, timestamp_ms: int = 0, *, epoch: int | None = None) -> Step:
        """One consumed record of the features topic, ``now`` the wall-clock time it
        arrived (s), ``timestamp_ms`` its Kafka timestamp (when it was made).

        ``epoch`` (:meth:`epoch` when it was consumed): a record whose partition was
        revoked since is ignored, neither placed nor acked. Whoever holds the partition
        now (this worker again, perhaps) replays it from the committed offset. Placed,
        it would count as the newest of its input and make the replayed records before it
        duplicates, never emitted. That was seen: 163 inputs, a stream's first 4.5 s, lost
        when a rebalance came while the agent read the outputs back for that record."""
        step = Step()
        if epoch is not None and epoch != self.epoch(partition):
            return step
        self._acks.hold(partition, offset)
        try:
            rec = decode_features(value)
        except InvalidInputError as exc:
            raw = RawMsg(topic=self.topic, partition=partition, offset=offset, key=key,
                         value=value, timestamp_ms=timestamp_ms)
            step.dead.append(dead_letter(raw, exc.reason, exc.detail))
            step.outcomes.append(("features", "dead_letter"))
            step.release(partition, self._acks.done(partition, offset))
            return step
        if isinstance(rec, ProgressMark):
            if self.marks is not None:
                self.marks.update(rec, now, via=partition)
            # what it lets close, the next tick closes (on_tick, every 50 ms)
            step.release(partition, self._acks.done(partition, offset))
            return step
        self._partition_of[rec.stream_id] = partition
        if self.marks is not None:
            self.marks.heard(rec.modality, rec.src_partition, rec.src_offset)
        src = source_of(rec)
        placed = (rec.stream_id, rec.modality, rec.src_partition)
        if (src in self._held or rec.src_offset <= self._placed.get(placed, -1)
                or src in self._restored.get(partition, ())):
            outcome = "duplicate"
        else:
            replay = 0 < timestamp_ms < self._replay_before_ms.get(partition, 0)
            res = self.aligner.add(rec, now, replay=replay, home=partition)
            outcome = res.outcome
            if res.late is not None:
                step.late.append(res.late)
            if outcome != "duplicate":
                self._placed[placed] = max(rec.src_offset, self._placed.get(placed, -1))
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
    def restore(self, partition: int, windows: Iterable[dict[str, Any]],
                late: Iterable[dict[str, Any]], now: float) -> int:
        """Take over ``partition`` knowing what the outputs already hold for it: decoded
        ``mm.aligned`` windows and ``mm.late`` events of that partition. Returns the
        number of streams restored."""
        sources = self._restored.setdefault(partition, set())
        newest: dict[str, dict[str, Any]] = {}
        until: dict[str, int] = {}
        for w in windows:
            sid = str(w["stream_id"])
            sources.update((str(m), int(p), int(o)) for m, p, o in w.get("sources") or ())
            until[sid] = max(until.get(sid, -1), int(w["window_end"]))
            if sid not in newest or w["window_start"] > newest[sid]["window_start"]:
                newest[sid] = w
        for ev in late:
            sid = str(ev["stream_id"])
            p, o = ev["src"]
            sources.add((str(ev["modality"]), int(p), int(o)))
            until[sid] = max(until.get(sid, -1), int(ev["window"]["end"]))
        for sid, end in until.items():
            w = newest.get(sid, {})
            offsets = {m: round(float(v) * 1000) for m, v in (w.get("offsets_ms") or {}).items()}
            self.aligner.restore(sid, end, offsets, dict(w.get("confidence") or {}), now,
                                 home=partition)
            self._partition_of[sid] = partition
        self._replay_before_ms[partition] = int(now * 1000)
        return len(until)

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
        dropped = set(sids)
        for key in [k for k in self._placed if k[0] in dropped]:
            del self._placed[key]
        for p in gone:
            self._restored.pop(p, None)
            self._replay_before_ms.pop(p, None)
            self._epochs[p] = self.epoch(p) + 1
        return sids

    def evict_idle(self, now: float) -> list[str]:
        """Forget streams idle past the stream TTL (``Aligner.evict_idle``)."""
        gone = self.aligner.evict_idle(now)
        for sid in gone:
            self._partition_of.pop(sid, None)
        dropped = set(gone)
        for key in [k for k in self._placed if k[0] in dropped]:
            del self._placed[key]
        return gone

    def open_records(self) -> int:
        return self.aligner.open_records()

    def waiting_acks(self) -> int:
        return self._acks.waiting()
