"""Strategies and the two example budgets shared by the fuzz targets.

Inputs come in three families, mixed in every target:

* **near-valid** — a valid object with one field mutated (replaced by a value of the wrong type, NaN or
  infinity, a huge integer, an empty, huge or unicode string, nested junk), removed, or an extra key added;
  also the valid object itself, so the success path is fuzzed too;
* **hostile JSON text** — deeply nested arrays/objects (past the JSON decoders' recursion limits), integers
  with thousands of digits, ``NaN``/``Infinity``/``1e999`` literals, duplicate keys, lone surrogates;
* **arbitrary** bytes and arbitrary JSON values.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

#: Examples per target: the default run (fast, derandomized) and the ``slow`` run (``-m slow``).
DEFAULT_EXAMPLES = int(os.environ.get("PRIVREC_FUZZ_EXAMPLES", "150"))
SLOW_EXAMPLES = 10_000

# derandomize: the same examples on every run (reproducible CI); no database (nothing written, nothing replayed)
settings.register_profile("fuzz-default", max_examples=DEFAULT_EXAMPLES, derandomize=True, database=None,
                          deadline=None, print_blob=True)
settings.register_profile("fuzz-slow", max_examples=SLOW_EXAMPLES, derandomize=True, database=None,
                          deadline=None, print_blob=True)


def profile(slow: bool) -> Callable[[Any], Any]:
    """The settings of a target's default test or of its ``slow`` twin. No health check is suppressed: none
    fires (the hostile texts are built from a few choices, not drawn byte by byte)."""
    return settings(settings.get_profile("fuzz-slow" if slow else "fuzz-default"))


# ---------------------------------------------------------------------------------------------- text

#: Any code point, lone surrogates included (``json.dumps`` escapes them as ``\\udXXX``).
ANY_CHAR = st.characters(codec=None, exclude_categories=())
ODD_STRINGS = st.sampled_from([
    "", " ", "\t", "\n", "\x00", "0", "1", "-1", "01", "1.0", "1e3", "1e999", "-0", "NaN", "nan", "inf", "-inf",
    "Infinity", "null", "true", "[]", "{}", ",", ",,", "1,", ",1", "1,,2", "\u0663", "\uff11", "\u00b2", "\ud800",
    "\udfff", "\U0001f600", "é", "e\u0301", "\u202e", "a" * 201, "x" * 5000, "9" * 5000, "1" + "0" * 400,
    "%", "%FF", "%00", "&", "=", "?", "#", "/", "\\", "'", '"', "<script>", "user", "k", "candidates",
])
TEXT = st.one_of(ODD_STRINGS, st.text(ANY_CHAR, max_size=30), st.text(max_size=300))

# ---------------------------------------------------------------------------------------------- numbers

HUGE_INTS = st.sampled_from([2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**308, 10**309, -(10**400),
                             10**1000])
NUMBERS = st.one_of(
    st.integers(), HUGE_INTS, st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 0.0, -0.0, 1.0, 0.5, 1.0000000000000002, -1e-300, 5e-324, 1e308, -1e308,
                     1.7976931348623157e308, float("nan"), float("inf"), float("-inf")]),
)

# ---------------------------------------------------------------------------------------------- JSON values

JSON_LEAF = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_ANY = st.recursive(JSON_LEAF, lambda kids: st.one_of(st.lists(kids, max_size=5),
                                                          st.dictionaries(TEXT, kids, max_size=5)),
                        max_leaves=25)


def dumps(obj: Any) -> bytes:
    """JSON as a careless client writes it: NaN/Infinity literals allowed, lone surrogates escaped."""
    return json.dumps(obj, allow_nan=True).encode()


def _nest(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


#: JSON *text* no Python value round-trips to: nesting past the decoders' limits, 5,000-digit numbers, ...
DEEP = st.builds(_nest, st.sampled_from([50, 999, 1000, 1025, 3000, 20000]), st.sampled_from(["list", "dict"]))
WEIRD_TEXT = st.one_of(
    DEEP,
    st.sampled_from(["1" * 5000, "-" + "9" * 4301, "1e999", "-1e999", "1" + "0" * 400 + ".0", "NaN", "-Infinity",
                     "0." + "0" * 5000 + "1", '"\\ud800"', '"\\u0000"', '"' + "\\" * 3, "[1,]", "{,}", "", " ",
                     "\ufeff{}", "{\"a\":1,\"a\":2}"]),
)


def _splice(valid: dict[str, Any], key: str, text: str) -> bytes:
    """``valid`` with ``key``'s value replaced by the raw JSON ``text`` (which may be no valid JSON at all)."""
    marker = "__FUZZ_SPLICE__"
    return dumps({**valid, key: marker}).replace(json.dumps(marker).encode(), text.encode("utf-8", "surrogatepass"))


def near_valid(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``valid`` (as JSON bytes) with one field mutated, removed or added, or a field's text made hostile."""
    keys = sorted(valid)
    replace = st.tuples(st.sampled_from(keys), JSON_ANY).map(lambda kv: dumps({**valid, kv[0]: kv[1]}))
    drop = st.sampled_from(keys).map(lambda k: dumps({kk: v for kk, v in valid.items() if kk != k}))
    extra = st.tuples(TEXT, JSON_ANY).map(lambda kv: dumps({**valid, kv[0]: kv[1]}))
    spliced = st.builds(_splice, st.just(valid), st.sampled_from(keys), WEIRD_TEXT)
    # a valid list field with one element mutated (contexts, report and batch vectors)
    lists = [k for k in keys if isinstance(valid[k], list) and valid[k]]
    strategies = [replace, drop, extra, spliced, st.just(dumps(valid))]
    if lists:
        strategies.append(st.builds(_mutate_element, st.just(valid), st.sampled_from(lists), st.integers(0, 99),
                                    JSON_ANY))
    return st.one_of(*strategies)


def _mutate_element(valid: dict[str, Any], key: str, index: int, value: Any) -> bytes:
    items = list(valid[key])
    items[index % len(items)] = value
    return dumps({**valid, key: items})


def _with_bad_bytes(data: bytes, at: int, junk: bytes) -> bytes:
    i = at % (len(data) + 1)
    return data[:i] + junk + data[i:]


def decoder_input(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Everything a decoder should survive: near-valid, hostile text, broken encodings, arbitrary bytes and JSON."""
    return st.one_of(
        near_valid(valid),
        WEIRD_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.builds(_with_bad_bytes, st.just(dumps(valid)), st.integers(0, 400),
                  st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x80\x80"])),
        st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "latin-1"]).map(
            lambda enc: json.dumps(valid, ensure_ascii=False).encode(enc)),
        st.binary(max_size=300),
        JSON_ANY.map(dumps),
    )


# ---------------------------------------------------------------------------------------------- query strings

def quote(text: str) -> str:
    return urllib.parse.quote(text, safe="", errors="surrogatepass")


#: One query component, already percent-encoded: quoted text, raw escapes of arbitrary bytes, or literal junk.
QUERY_PART = st.one_of(
    TEXT.map(quote),
    st.binary(max_size=12).map(lambda b: urllib.parse.quote_from_bytes(b, safe="")),
    st.sampled_from(["", "%", "%F", "%FF", "%00", "%ZZ", "+", "%2C", ",", "%C3%28", "a%20b", "%ED%A0%80"]),
)


def query(names: list[str], values: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[str]:
    """``?a=1&b=2...``: known parameter names (each with its own near-valid values) and junk ones, repeated or
    not, with or without ``=``; values percent-encoded as a browser would, or not."""
    def pair(name: str) -> st.SearchStrategy[str]:
        value = st.one_of(values[name].map(quote), QUERY_PART) if name in values else QUERY_PART
        return st.one_of(st.builds(lambda v: f"{quote(name)}={v}", value), st.just(quote(name)))

    known = st.sampled_from(names).flatmap(pair)
    junk = st.builds(lambda n, v: f"{n}={v}", QUERY_PART, QUERY_PART)
    parts = st.lists(st.one_of(known, known, junk), max_size=5)
    return parts.map(lambda ps: ("?" + "&".join(ps)) if ps else "")
