"""Content-addressed feature cache: a byte-budgeted W-TinyLFU policy over RocksDB.

``FeatureCache.from_settings(settings, metrics)`` opens the worker's cache;
``content_key(modality, data, model_version)`` names an input's features.
"""

from __future__ import annotations

from app.cache.policy import FrequencySketch, LFUPolicy, LRUPolicy, Policy, WTinyLFU
from app.cache.store import HEADER_BYTES, CacheStats, FeatureCache, Lookup, Result, content_key

__all__ = [
    "HEADER_BYTES",
    "CacheStats",
    "FeatureCache",
    "FrequencySketch",
    "LFUPolicy",
    "LRUPolicy",
    "Lookup",
    "Policy",
    "Result",
    "WTinyLFU",
    "content_key",
]
