"""The HTTP API's two shared pieces: its JSON error, and the one parser of JSON request bodies.

Every route answers an error as ``{"error": {"parameter": ..., "message": ...}}`` (:func:`error`). A route that
takes a JSON body reads it with :func:`read_body`, which either returns the body's fields checked and converted,
or raises :class:`BodyError` naming the field at fault; the web app's middleware answers that error with a 400.

The rules of a field are those of its kind (:class:`Field`):

* ``id`` — a non-empty string of valid text (no lone surrogate: no Redis key or topic can carry one), at most
  :data:`~pipeline.data.records.MAX_ID_CHARS` characters: what one request may make the server keep per id;
* ``reward`` — a finite number in ``[0, 1]`` (the sensitivities assume it; a boolean is not a number);
* ``ids`` — a list of ``id`` strings.

Examples
--------
>>> fields = (Field("user", "id"), Field("reward", "reward", required=False, default=1.0))
>>> check_fields({"user": "7"}, fields)
{'user': '7', 'reward': 1.0}
>>> check_fields({"user": "7", "reward": True}, fields)
Traceback (most recent call last):
...
pipeline.serve.httpio.BodyError: `reward`: must be a finite number in [0, 1], got True
>>> check_fields({"user": "u" * 129}, fields)
Traceback (most recent call last):
...
pipeline.serve.httpio.BodyError: `user`: must be at most 128 characters (MAX_ID_CHARS), got 129
>>> check_fields({"user": "7", "age": 3}, fields, closed=True)
Traceback (most recent call last):
...
pipeline.serve.httpio.BodyError: `age`: unknown field(s) ['age']; use user, reward
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from ..data.records import MAX_ID_CHARS

__all__ = ["error", "BodyError", "Field", "read_body", "check_fields", "check_id", "MAX_ID_CHARS"]


def error(status: int, parameter: str | None, message: str) -> web.Response:
    """The JSON error every route answers: ``parameter`` names the query parameter, body field or header at fault
    (``None``: none in particular)."""
    return web.json_response({"error": {"parameter": parameter, "message": message}}, status=status)


class BodyError(ValueError):
    """A request body that breaks its route's rules; ``parameter`` names the field (``"body"``: the whole body)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"`{parameter}`: {message}")
        self.parameter = parameter
        self.message = message

    def response(self) -> web.Response:
        """The 400 that answers it."""
        return error(400, self.parameter, self.message)


@dataclass(frozen=True)
class Field:
    """One field of a JSON body: its ``name``, ``kind`` (``id``, ``reward`` or ``ids``), whether it is
    ``required``, the ``default`` when it is not given, and ``what`` it is (the message of a wrong value)."""

    name: str
    kind: Literal["id", "reward", "ids"]
    required: bool = True
    default: Any = None
    what: str = ""


def check_id(value: Any, name: str, what: str = "") -> str:
    """``value`` as an id (module docstring), or :class:`BodyError` naming ``name``."""
    if not isinstance(value, str) or not value:
        raise BodyError(name, f"must be {what or 'an id string'}")
    if len(value) > MAX_ID_CHARS:
        raise BodyError(name, f"must be at most {MAX_ID_CHARS} characters (MAX_ID_CHARS), got {len(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, "\ud800" in the JSON
        raise BodyError(name, "must be valid Unicode text (no lone surrogates)") from None
    return value


def _reward(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BodyError(name, f"must be a finite number in [0, 1], got {value!r}")
    try:
        reward = float(value)
    except OverflowError:
        raise BodyError(name, "must be a finite number in [0, 1], got an integer too large for a float") from None
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise BodyError(name, f"must be a finite number in [0, 1], got {value!r}")
    return reward


def _ids(value: Any, name: str, what: str) -> list[str]:
    if not isinstance(value, list):
        raise BodyError(name, f"must be {what or 'a list of id strings'}")
    return [check_id(v, name, what or "a list of id strings") for v in value]


_CHECKS = {"id": check_id, "reward": lambda v, name, what: _reward(v, name), "ids": _ids}


def check_fields(body: dict[str, Any], fields: Sequence[Field], *, closed: bool = False) -> dict[str, Any]:
    """``body``'s ``fields``, checked and converted (a missing optional field takes its default); ``closed``:
    a field not in ``fields`` is an error too. Raises :class:`BodyError` naming the first field at fault."""
    if closed:
        unknown = sorted(set(body) - {f.name for f in fields})
        if unknown:
            raise BodyError(unknown[0], f"unknown field(s) {unknown}; use {', '.join(f.name for f in fields)}")
    out: dict[str, Any] = {}
    for f in fields:
        if f.name not in body:
            if f.required:
                raise BodyError(f.name, "is required" + (f": {f.what}" if f.what else ""))
            out[f.name] = f.default
            continue
        out[f.name] = _CHECKS[f.kind](body[f.name], f.name, f.what)
    return out


async def read_body(request: web.Request, fields: Sequence[Field], *, closed: bool = False) -> dict[str, Any]:
    """The request's JSON object body, its ``fields`` checked (:func:`check_fields`); :class:`BodyError` naming
    ``body`` when it is not a JSON object (not JSON, not UTF-8, a 5,000-digit integer, nesting too deep)."""
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        shape = ", ".join(f'"{f.name}"' if f.required else f'["{f.name}"]' for f in fields)
        raise BodyError("body", f"must be a JSON object {{{shape}}}")
    return check_fields(body, fields, closed=closed)
