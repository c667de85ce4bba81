"""msgpack encode/decode; every msgpack or shape error becomes ``InvalidInputError``.

Arrays travel as ``{"dtype": str, "shape": [int], "data": bytes}`` so a consumer
in any language can rebuild them without pickle.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from schemas.errors import InvalidInputError

__all__ = ["decode_map", "encode", "pack_array", "unpack_array"]

_ALLOWED_DTYPES = frozenset({"float16", "float32", "float64", "int8", "uint8", "int16", "int32",
                             "int64"})
#: Refuse absurd containers before msgpack allocates them (a 4-byte header can
#: announce 2**32 entries).
_MAX_LEN = 16 * 1024 * 1024


def encode(obj: dict[str, Any]) -> bytes:
    """Encode a record (a map with string keys) as msgpack bytes."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def decode_map(raw: bytes | None) -> dict[str, Any]:
    """Decode msgpack bytes that must hold one map with string keys."""
    if raw is None:
        raise InvalidInputError("bad_msgpack", "the record has no value (tombstone)")
    try:
        obj = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_bin_len=_MAX_LEN,
            max_str_len=_MAX_LEN,
            max_array_len=_MAX_LEN,
            max_map_len=_MAX_LEN,
        )
    except (ValueError, msgpack.UnpackException, TypeError) as exc:
        # ExtraData, FormatError, StackError and UnicodeDecodeError are ValueErrors.
        raise InvalidInputError("bad_msgpack", f"not one msgpack value: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidInputError("schema", f"expected a map, got {type(obj).__name__}")
    return obj


def pack_array(arr: np.ndarray) -> dict[str, Any]:
    """An ndarray as bytes + dtype + shape (C order)."""
    a = np.ascontiguousarray(arr)
    return {"dtype": a.dtype.name, "shape": list(a.shape), "data": a.tobytes()}


def unpack_array(obj: Any) -> np.ndarray:
    """Inverse of :func:`pack_array`; rejects shapes that do not match the bytes."""
    try:
        dtype = obj["dtype"]
        shape = tuple(int(s) for s in obj["shape"])
        data = obj["data"]
    except (KeyError, TypeError, ValueError):
        raise InvalidInputError("schema", "array needs dtype, shape and data") from None
    if dtype not in _ALLOWED_DTYPES or not isinstance(data, bytes):
        raise InvalidInputError("schema", f"array dtype {dtype!r} not allowed")
    arr = np.frombuffer(data, dtype=np.dtype(dtype))
    if int(np.prod(shape, dtype=np.int64)) != arr.size:
        raise InvalidInputError("schema", f"array shape {shape} does not match {arr.size} items")
    return arr.reshape(shape)
