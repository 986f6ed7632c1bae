"""Plain-bytes codecs for state objects.

Every stateful object in :mod:`models` turns into a ``dict[str, bytes]`` of
raw little-endian arrays plus their shape, dtype and a schema version, and
back again bit-exactly. No pickles: the mapping can be written to Redis as a
hash and read by any language.

Examples
--------
>>> import numpy as np
>>> m = encode_arrays({"x": np.arange(3.0)}, scalars={"t": 7}, schema="demo/1")
>>> arrays, scalars = decode_arrays(m, schema="demo/1")
>>> arrays["x"], scalars["t"]
(array([0., 1., 2.]), 7)
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

__all__ = ["encode_arrays", "decode_arrays", "SchemaError"]

_DTYPES: dict[str, np.dtype[np.generic]] = {"<f8": np.dtype("<f8"), "<i8": np.dtype("<i8"), "|u1": np.dtype("|u1")}


class SchemaError(ValueError):
    """A mapping does not hold the state type or version it is decoded as."""


def encode_arrays(
    arrays: Mapping[str, NDArray[np.generic]],
    *,
    scalars: Mapping[str, int | float | str | None] | None = None,
    schema: str,
) -> dict[str, bytes]:
    """Encode named arrays and JSON scalars into a ``dict[str, bytes]``.

    Float arrays are stored as ``<f8`` and integer arrays as ``<i8``; the
    ``meta`` entry records each array's shape and dtype and the ``schema``.
    """
    out: dict[str, bytes] = {}
    meta: dict[str, object] = {"schema": schema, "arrays": {}, "scalars": dict(scalars or {})}
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.dtype.kind == "f":
            a = a.astype("<f8", copy=False)
        elif a.dtype.kind in "iu" and a.dtype != np.dtype("|u1"):
            a = a.astype("<i8", copy=False)
        dt = a.dtype.str
        if dt not in _DTYPES:
            raise TypeError(f"array {name!r} has unsupported dtype {a.dtype}.")
        out[f"a:{name}"] = np.ascontiguousarray(a).tobytes()
        meta["arrays"][name] = {"shape": list(a.shape), "dtype": dt}  # type: ignore[index]
    out["meta"] = json.dumps(meta, sort_keys=True).encode()
    return out


def decode_arrays(
    mapping: Mapping[str | bytes, bytes], *, schema: str
) -> tuple[dict[str, NDArray[np.generic]], dict[str, int | float | str | None]]:
    """Invert :func:`encode_arrays`; raise :class:`SchemaError` on a mismatch.

    Keys may be ``str`` or ``bytes`` (as redis-py returns them).
    """
    m = {k.decode() if isinstance(k, bytes) else k: v for k, v in mapping.items()}
    if "meta" not in m:
        raise SchemaError("state mapping has no 'meta' entry.")
    meta = json.loads(m["meta"])
    if meta.get("schema") != schema:
        raise SchemaError(f"expected schema {schema!r}, got {meta.get('schema')!r}.")
    arrays: dict[str, NDArray[np.generic]] = {}
    for name, info in meta["arrays"].items():
        raw = m.get(f"a:{name}")
        if raw is None:
            raise SchemaError(f"state mapping lacks array {name!r}.")
        dt: np.dtype[np.generic] = _DTYPES[info["dtype"]]
        arr = np.frombuffer(raw, dtype=dt).reshape(info["shape"]).copy()
        arrays[name] = arr
    return arrays, dict(meta["scalars"])
