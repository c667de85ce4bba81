"""The feature cache on RocksDB: content-addressed, a TTL per modality, a byte budget.

One :class:`FeatureCache` per worker process, shared by the extractor threads
(one per modality) behind one lock. Each worker process needs its own
directory: RocksDB locks it (``Settings.data_dir / "cache"`` per worker).

Layout. The RocksDB key is one modality byte plus the caller's content key
(:func:`content_key`, a 16-byte blake2b digest), so an evicted key names its
modality for the metrics and a restart knows what it holds. The value is a
16-byte header (magic ``FC``, format version, modality byte, expiry in epoch
seconds with 0 for never, CRC-32 of the payload) and then the payload.

Budget. An entry weighs ``len(key) + len(header) + len(payload)`` bytes and the
W-TinyLFU policy holds the sum at most ``max_bytes`` after every call
returns: the margin is 0 bytes. Victims are deleted in the same RocksDB write
batch that adds the new entry, so no reader ever sees more either. The budget
counts logical bytes; RocksDB's own footprint (write-ahead log, memtables,
tombstones until compaction) comes on top, typically a few tens of MiB.

Results of a look-up (``mmsync_cache_requests_total{result}``): ``hit``;
``miss`` (not held); ``expired`` (held past its TTL: deleted, recompute);
``corrupt`` (bad header or checksum: deleted, recompute).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, NamedTuple

from rocksdict import Options, Rdict, WriteBatch

from app.cache.policy import Policy, WTinyLFU
from app.errors import ConfigError, TransientError
from app.settings import MODALITIES, Settings, default_cache_bytes

if TYPE_CHECKING:
    from app.runtime.metrics import Metrics

__all__ = ["HEADER_BYTES", "CacheStats", "FeatureCache", "Lookup", "Result", "content_key"]

log = logging.getLogger(__name__)

Result = Literal["hit", "miss", "expired", "corrupt"]
_RESULTS: tuple[Result, ...] = ("hit", "miss", "expired", "corrupt")

_MAGIC = b"FC"
_VERSION = 1
# magic, version, modality code, expires_at (epoch s, 0: never), crc32(payload)
_HEADER = struct.Struct("<2sBBqI")
HEADER_BYTES = _HEADER.size
_CODES = {m: i + 1 for i, m in enumerate(MODALITIES)}
_NAMES = {c: m for m, c in _CODES.items()}
#: Expired entries removed per modality per call by the piggy-backed sweep: bounds
#: the latency one get or put can pay for cleaning up (~10 us each).
_SWEEP_BATCH = 32
#: Average feature size the sketch is sized for, bytes (image ~5 KB, text ~1 KB, audio ~2 KB).
_ENTRY_HINT_BYTES = 2048


def content_key(modality: str, data: bytes, model_version: str) -> bytes:
    """16-byte blake2b digest of the modality, the model version and the input bytes.

    A new model version gets new keys, so stale features are never served; the
    old ones age out under the budget and the TTL.
    """
    h = blake2b(digest_size=16, person=b"mmsync-fc-v1")
    m, v = modality.encode(), model_version.encode()
    h.update(struct.pack("<HH", len(m), len(v)))  # lengths first: no ambiguous concatenations
    h.update(m)
    h.update(v)
    h.update(data)
    return h.digest()


class Lookup(NamedTuple):
    value: bytes | None
    result: Result


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    expired: int
    corrupt: int
    evictions: int
    expirations: int
    rejected: int
    dropped_on_open: int
    entries: int
    bytes: int
    max_bytes: int

    @property
    def hit_ratio(self) -> float:
        n = self.hits + self.misses + self.expired + self.corrupt
        return self.hits / n if n else 0.0


def _parse(dbkey: bytes, raw: bytes) -> tuple[int, bytes] | None:
    """(expires_at, payload), or None when the record is not one we wrote intact."""
    if len(raw) < HEADER_BYTES or len(dbkey) < 2:
        return None
    magic, version, code, exp, crc = _HEADER.unpack_from(raw)
    payload = raw[HEADER_BYTES:]
    if (magic != _MAGIC or version != _VERSION or code != dbkey[0] or code not in _NAMES
            or zlib.crc32(payload) != crc):
        return None
    return exp, payload


class FeatureCache:
    """Byte-budgeted, TTL'd feature cache on RocksDB. Thread-safe.

    Args:
        path: directory of the RocksDB database (created if missing).
        max_bytes: budget in bytes; 0 means :func:`app.settings.default_cache_bytes`.
        ttl_s: seconds an entry lives, per modality; 0 or absent: it never expires.
        metrics: where to count requests, evictions and expirations, if anywhere.
        clock: epoch seconds; tests inject a fake one.
        policy: eviction policy (default :class:`WTinyLFU` over ``max_bytes``).
    """

    def __init__(self, path: Path | str, max_bytes: int = 0,
                 ttl_s: Mapping[str, int] | None = None, *, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.time, policy: Policy | None = None) -> None:
        self.max_bytes = max_bytes or default_cache_bytes()
        self._ttl = {m: int((ttl_s or {}).get(m, 0)) for m in MODALITIES}
        self._clock = clock
        # `is None`, not `or`: an empty policy has len 0 and is falsy.
        self._policy: Policy = policy if policy is not None else WTinyLFU(
            self.max_bytes, expected_entry_bytes=_ENTRY_HINT_BYTES)
        self._prefix = {m: bytes([c]) for m, c in _CODES.items()}
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("hit", "miss", "expired", "corrupt", "evictions", "expirations", "rejected",
             "dropped_on_open"), 0)
        # Expiry queues, one per modality: its TTL is fixed, so put order is expiry order
        # and the sweep only ever looks at the heads.
        self._expiry: dict[int, deque[tuple[int, bytes]]] = {c: deque() for c in _NAMES}
        self._metrics = metrics
        if metrics is not None:
            self._m_req = {(m, r): metrics.cache_requests.labels(m, r)
                           for m in MODALITIES for r in _RESULTS}
            self._m_evict = {c: metrics.cache_evictions.labels(m) for c, m in _NAMES.items()}
            self._m_expire = {c: metrics.cache_expirations.labels(m) for c, m in _NAMES.items()}
        p = Path(path)
        try:
            p.mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(p), options=Options(raw_mode=True))
        except Exception as exc:  # rocksdict raises bare Exception, e.g. on a held LOCK
            raise ConfigError(f"cannot open the feature cache at {p}: {exc}") from exc
        self._closed = False
        self._rebuild()

    @classmethod
    def from_settings(cls, s: Settings, metrics: Metrics | None = None) -> FeatureCache:
        """The worker's cache: ``s.data_dir / "cache"``, ``s.cache_max_bytes``, the TTLs."""
        return cls(s.data_dir / "cache", s.cache_max_bytes, {m: s.ttl_s(m) for m in MODALITIES},
                   metrics=metrics)

    # -- open ---------------------------------------------------------------------------

    def _rebuild(self) -> None:
        """Re-admit what the database holds (frequencies start cold); drop expired and
        corrupt records, and anything over a budget that shrank since the last run."""
        now = self._clock()
        drop: list[bytes] = []
        queues: dict[int, list[tuple[int, bytes]]] = {c: [] for c in _NAMES}
        for k, v in self._db.items():
            if not isinstance(k, bytes) or not isinstance(v, bytes):
                raise ConfigError(f"{self._db.path()} is not a feature cache (not raw mode)")
            parsed = _parse(k, v)
            if parsed is None:
                drop.append(k)
                self._counts["dropped_on_open"] += 1
                continue
            exp = parsed[0]
            if exp and exp <= now:
                drop.append(k)
                self._count_expiration(k[0])
                continue
            evicted = self._policy.admit(k, len(k) + len(v))
            drop.extend(evicted)
            self._counts["evictions"] += len(evicted)
            if exp:
                queues[k[0]].append((exp, k))
        for c, q in queues.items():
            q.sort()
            self._expiry[c].extend(q)
        if drop:
            wb = WriteBatch(raw_mode=True)
            for k in drop:
                wb.delete(k)
            self._db.write(wb)
        self._set_gauge()
        if drop:
            log.info("feature cache opened: %d entries, %d bytes, %d dropped",
                     len(self._policy), self._policy.weighted_size, len(drop))

    # -- requests -----------------------------------------------------------------------

    def _dbkey(self, modality: str, key: bytes) -> bytes:
        try:
            return self._prefix[modality] + key
        except KeyError:
            raise ValueError(f"unknown modality {modality!r}") from None

    def lookup(self, modality: str, key: bytes) -> Lookup:
        """The payload stored under ``key`` and how the look-up went."""
        dbkey = self._dbkey(modality, key)
        with self._lock:
            self._check_open()
            now = self._clock()
            value: bytes | None = None
            result: Result = "miss"
            if self._policy.touch(dbkey):
                raw = self._db.get(dbkey)
                parsed = None if raw is None else _parse(dbkey, raw)
                if parsed is None:
                    result = "miss" if raw is None else "corrupt"
                    self._remove(dbkey)
                elif parsed[0] and parsed[0] <= now:
                    result = "expired"
                    self._remove(dbkey)
                    self._count_expiration(dbkey[0])
                else:
                    result = "hit"
                    value = parsed[1]
            self._counts[result] += 1
            if self._metrics is not None:
                self._m_req[modality, result].inc()
            # After the read, so a key the caller asks for reports `expired`, not `miss`.
            self._sweep(now, _SWEEP_BATCH)
            return Lookup(value, result)

    def get(self, modality: str, key: bytes) -> bytes | None:
        """The payload, or None when the caller must compute it (miss, expired or corrupt)."""
        return self.lookup(modality, key).value

    def put(self, modality: str, key: bytes, value: bytes) -> None:
        """Store ``value``, unless the policy refuses it (too big, or colder than what it
        would displace). Raises TransientError if RocksDB fails the write: the feature
        is then simply not cached."""
        dbkey = self._dbkey(modality, key)
        with self._lock:
            self._check_open()
            now = self._clock()
            self._sweep(now, _SWEEP_BATCH)
            ttl = self._ttl[modality]
            exp = math.ceil(now + ttl) if ttl > 0 else 0  # rounded up: never shorter than ttl
            rec = _HEADER.pack(_MAGIC, _VERSION, dbkey[0], exp, zlib.crc32(value)) + value
            evicted = self._policy.admit(dbkey, len(dbkey) + len(rec))
            wb = WriteBatch(raw_mode=True)
            stored = True
            for k in evicted:
                wb.delete(k)
                if k == dbkey:
                    stored = False
                    self._counts["rejected"] += 1
                else:
                    self._counts["evictions"] += 1
                    if self._metrics is not None:
                        self._m_evict[k[0]].inc()
            if stored:
                wb.put(dbkey, rec)
            try:
                self._db.write(wb)
            except Exception as exc:  # disk full or I/O error: forget the entry, keep serving
                self._policy.remove(dbkey)
                raise TransientError(f"feature cache write failed: {exc}") from exc
            if stored and exp:
                self._expiry[dbkey[0]].append((exp, dbkey))
            self._set_gauge()

    def sweep(self) -> int:
        """Remove every expired entry now; returns how many. Gets and puts already do this
        in small batches, so calling it is optional (e.g. from a timer when traffic stops)."""
        with self._lock:
            self._check_open()
            return self._sweep(self._clock(), None)

    # -- internals (lock held) ----------------------------------------------------------

    def _sweep(self, now: float, limit: int | None) -> int:
        removed = 0
        for code, q in self._expiry.items():
            n = 0
            while q and q[0][0] <= now and (limit is None or n < limit):
                _, k = q.popleft()
                n += 1
                if k not in self._policy:
                    continue  # evicted already
                raw = self._db.get(k)
                parsed = None if raw is None else _parse(k, raw)
                if parsed is not None and not (parsed[0] and parsed[0] <= now):
                    continue  # rewritten since, with a later expiry
                self._remove(k)
                removed += 1
                if parsed is not None:
                    self._count_expiration(code)
        if removed:
            self._set_gauge()
        return removed

    def _remove(self, dbkey: bytes) -> None:
        self._policy.remove(dbkey)
        self._db.delete(dbkey)
        self._set_gauge()

    def _count_expiration(self, code: int) -> None:
        self._counts["expirations"] += 1
        if self._metrics is not None:
            self._m_expire[code].inc()

    def _set_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.cache_bytes.set(self._policy.weighted_size)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the feature cache is closed")

    # -- lifecycle ------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        with self._lock:
            c = self._counts
            return CacheStats(
                hits=c["hit"], misses=c["miss"], expired=c["expired"], corrupt=c["corrupt"],
                evictions=c["evictions"], expirations=c["expirations"], rejected=c["rejected"],
                dropped_on_open=c["dropped_on_open"], entries=len(self._policy),
                bytes=self._policy.weighted_size, max_bytes=self.max_bytes)

    def close(self) -> None:
        """Flush and close the database; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._db.close()

    def __enter__(self) -> FeatureCache:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
