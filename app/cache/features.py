"""Features in and out of the cache: msgpack payloads, the worker's cache directory.

The extractors call :class:`FeatureMemo` with the input bytes and their model
version; it turns feature dicts into bytes and back and measures the time
spent (the ``cache`` stage). Only content-pure features belong here: what
depends on a stream's history (image ``change``, Silero VAD's state) is
recomputed by the extractor every time.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from app.cache.store import FeatureCache, content_key
from app.errors import ConfigError, TransientError
from app.settings import MODALITIES, Settings

if TYPE_CHECKING:
    from app.runtime.metrics import Metrics

__all__ = ["FeatureMemo", "open_worker_cache"]

log = logging.getLogger(__name__)

#: Cache directories tried in turn: RocksDB locks a directory to one process, so
#: workers sharing a data dir (tests, one host) each take the first free slot; a
#: restarted worker finds its old slot free again (the lock dies with the process).
_SLOTS = 16


def open_worker_cache(s: Settings, metrics: Metrics | None = None) -> FeatureCache:
    """This process's cache under ``s.data_dir``: ``cache``, else ``cache-1`` ... ``cache-15``."""
    last: ConfigError | None = None
    for slot in range(_SLOTS):
        path = s.data_dir / ("cache" if slot == 0 else f"cache-{slot}")
        try:
            return FeatureCache(Path(path), s.cache_max_bytes,
                                {m: s.ttl_s(m) for m in MODALITIES}, metrics=metrics)
        except ConfigError as exc:
            last = exc
    raise ConfigError(f"no free feature cache directory under {s.data_dir}: {last}")


class FeatureMemo:
    """Feature dicts by content key, over one :class:`FeatureCache`; thread-safe.

    A payload that does not decode (a format from another release) is a miss; a
    failed write only costs the entry. ``seconds()`` is the calling thread's
    total time in here, so an extractor thread can charge it to its records.
    """

    def __init__(self, cache: FeatureCache) -> None:
        self.cache = cache
        self._local = threading.local()

    def key(self, modality: str, data: bytes, version: str) -> bytes:
        return content_key(modality, data, version)

    def seconds(self) -> float:
        return float(getattr(self._local, "s", 0.0))

    def _charge(self, t0: float) -> None:
        self._local.s = self.seconds() + time.perf_counter() - t0

    def get(self, modality: str, key: bytes) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        try:
            raw = self.cache.get(modality, key)
            if raw is None:
                return None
            try:
                obj = msgpack.unpackb(raw, raw=False)
            except (ValueError, msgpack.UnpackException, TypeError):
                obj = None
            if not isinstance(obj, dict):
                log.warning("feature cache: undecodable %s entry, recomputing", modality)
                return None
            return obj
        finally:
            self._charge(t0)

    def put(self, modality: str, key: bytes, feats: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            self.cache.put(modality, key, msgpack.packb(feats, use_bin_type=True))
        except TransientError as exc:
            log.warning("%s", exc)
        finally:
            self._charge(t0)

    def close(self) -> None:
        self.cache.close()
