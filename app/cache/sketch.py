"""Count-min frequency sketch for W-TinyLFU admission (pure).

Keys are expected to be uniformly distributed digests (``content_key`` makes
16-byte blake2b digests): the sketch takes its row indexes straight from the
key's last bytes instead of hashing again, which is most of its speed.
Shorter keys are hashed with blake2b first.
"""

from __future__ import annotations

from hashlib import blake2b

__all__ = ["FrequencySketch"]

_FROM = int.from_bytes
#: Counters saturate at 15, the range of Caffeine's 4-bit counters (one byte each
#: here: a bytearray indexes faster than packed nibbles in pure Python).
_COUNTER_MAX = 15
#: bytes.translate table that halves every counter at once (the sketch's aging).
_HALVE = bytes(v >> 1 for v in range(256))


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


class FrequencySketch:
    """Count-min sketch: 4 rows of saturating counters, all halved every ``sample`` adds.

    Sized from ``expected_entries`` (about how many keys the cache holds): each row
    has ``8 * expected_entries`` counters (rounded up to a power of two) and the
    counters age every ``40 * expected_entries`` increments. Caffeine uses 4 and 10;
    the wider, slower sketch with conservative update (only the smallest counters
    grow) measured 0.3 to 0.6 points better on the bench's traces and costs 32 bytes
    per expected entry (32 MiB for a 2 GiB cache of 2 KB features).
    """

    def __init__(self, expected_entries: int) -> None:
        n = max(expected_entries, 16)
        self.width = w = _pow2_at_least(8 * n)
        self._bits = bits = w.bit_length() - 1
        self._mask = w - 1
        # Four rows of `bits` bits each come out of one integer read from the key.
        self._nbytes = 8 if 4 * bits <= 64 else 16
        self._table = bytearray(4 * w)
        self.sample = 40 * n
        self.additions = 0
        self.resets = 0

    def _hash(self, key: bytes) -> int:
        nb = self._nbytes
        if len(key) < nb:
            key = blake2b(key, digest_size=16).digest()
        return _FROM(key[-nb:], "little")

    def increment(self, key: bytes) -> None:
        h = self._hash(key)
        m, b, w, t = self._mask, self._bits, self.width, self._table
        i0 = h & m
        i1 = w + ((h >> b) & m)
        i2 = 2 * w + ((h >> 2 * b) & m)
        i3 = 3 * w + ((h >> 3 * b) & m)
        v = min(t[i0], t[i1], t[i2], t[i3])
        if v < _COUNTER_MAX:
            v += 1
            # Conservative update: raising a counter already above the minimum would only
            # add another key's noise to this one's estimate.
            if t[i0] < v:
                t[i0] = v
            if t[i1] < v:
                t[i1] = v
            if t[i2] < v:
                t[i2] = v
            if t[i3] < v:
                t[i3] = v
        self.additions += 1
        if self.additions >= self.sample:
            self.reset()

    def frequency(self, key: bytes) -> int:
        """Estimated count: the smallest of the key's four counters (never an underestimate
        between resets)."""
        h = self._hash(key)
        m, b, w, t = self._mask, self._bits, self.width, self._table
        return min(t[h & m], t[w + ((h >> b) & m)], t[2 * w + ((h >> 2 * b) & m)],
                   t[3 * w + ((h >> 3 * b) & m)])

    def reset(self) -> None:
        """Aging: halve every counter, so yesterday's favourites fade (one C-speed pass)."""
        self._table = bytearray(self._table.translate(_HALVE))
        self.additions //= 2
        self.resets += 1
