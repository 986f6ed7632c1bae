"""Encode-shuffle-analyze, the pipeline's side: the key files, the public seal description, the analyzer's opening.

``privrec up --mode local --shuffle-batch n`` runs the shuffler as a party of its own
(:mod:`pipeline.modes.local.shuffler_service`: its own process, port, Redis user and keys ``{ns}-shuffler:*``). The stack's
state directory then holds ``esa/`` (:func:`create_keys`):

* ``esa/analyzer-key.pem`` (0600): the analyzer's P-256 private key. Only the worker (the analyzer) is told where
  it is (``PRIVREC_ANALYZER_KEY``); the web server and the shuffler are not.
* ``esa/public.json``: the public key and the shuffler's URL — what a device needs (``GET /local/config``'s
  ``"esa"``; the web server reads it through ``PRIVREC_ESA_PUBLIC``).

The analyzer (:class:`pipeline.modes.local.ingest.BatchIngestProcessor`) takes a sealed batch from ``ldp-shuffled`` and
opens it (:func:`models.local.esa.open_batch`, re-exported here): each content is decrypted and parsed; one that fails (a wrong key, changed
bytes, a malformed content) is a dead letter with the reason — its sealed bytes, never an opened content. A batch
with a failed content counts **not at all** (its other contents are dead letters too, naming why): the batch's
shown items come as one multiset, unlinked from the contents on purpose (a content next to its list would
re-identify it: the web server knows which list it showed to whom), so the analyzer cannot tell which items were
the failed content's, and adding them all would put a failed report's list into the Gram with no vector
(docs/local-parties.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.local import LocalConfig, ReportError
from models.local.esa import CONTENT_SCHEMA, ENVELOPE_SCHEMA, OpenedBatch, is_sealed_batch, open_batch
from models.local.seal import AnalyzerKey, b64encode

__all__ = ["KEY_ENV", "PUBLIC_ENV", "ESA_DIR", "create_keys", "analyzer_key", "public_description", "open_batch",
           "OpenedBatch", "is_sealed_batch", "separate_shuffler", "parties"]

#: Where the worker finds the analyzer's private key (set for the worker only).
KEY_ENV = "PRIVREC_ANALYZER_KEY"
#: Where the web server finds the public description (``public.json``).
PUBLIC_ENV = "PRIVREC_ESA_PUBLIC"
#: The stack's directory of ESA files, under its state directory.
ESA_DIR = "esa"


def create_keys(state_dir: Path, *, shuffler_url: str) -> tuple[Path, Path]:
    """The stack's analyzer key pair: the private key (0600, in a 0700 directory) and ``public.json``.

    A key already in ``state_dir`` is kept (the shuffler's Redis, persisted, may hold envelopes sealed to it: a
    new key would make them undecryptable); ``public.json`` is written again with ``shuffler_url``.
    """
    d = state_dir / ESA_DIR
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)
    priv = d / "analyzer-key.pem"
    if priv.exists():
        key = AnalyzerKey.from_pem(priv.read_bytes())
    else:
        key = AnalyzerKey.generate()
        fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.to_pem())
    pub = d / "public.json"
    pub.write_text(json.dumps({"public_key": b64encode(key.public_bytes()), "shuffler": shuffler_url}))
    return priv, pub


def analyzer_key(environ: os._Environ[str] | dict[str, str] | None = None) -> AnalyzerKey | None:
    """The analyzer's key if this process was given it (``PRIVREC_ANALYZER_KEY``), else ``None``."""
    path = (os.environ if environ is None else environ).get(KEY_ENV)
    return None if not path else AnalyzerKey.from_pem(Path(path).read_bytes())


def public_description(environ: os._Environ[str] | dict[str, str] | None = None) -> dict[str, Any] | None:
    """``GET /local/config``'s ``"esa"``: how a device seals and where it sends (``None``: no separate shuffler)."""
    path = (os.environ if environ is None else environ).get(PUBLIC_ENV)
    if not path:
        return None
    pub = json.loads(Path(path).read_text())
    return {"shuffler": pub["shuffler"].rstrip("/") + "/submit", "public_key": pub["public_key"],
            "curve": "P-256", "kdf": "HKDF-SHA256", "aead": "AES-256-GCM", "envelope": ENVELOPE_SCHEMA,
            "content": CONTENT_SCHEMA}


def separate_shuffler(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Whether this process belongs to a stack whose shuffler is its own party (the worker has the key, the web
    server the public description)."""
    env = os.environ if environ is None else environ
    return bool(env.get(KEY_ENV) or env.get(PUBLIC_ENV))


def parties(config: LocalConfig, *, separate: bool) -> dict[str, Any]:
    """The guarantee of one shuffled report against each party (``/budget``'s local statement, docs/local-parties.md).

    Laplace reports: ``epsilon0`` per report locally, ``(epsilon, delta)`` per batch centrally. Codewords
    (docs/local-protocol.md): no local guarantee (``epsilon`` ``None``), and centrally ``(epsilon, delta)`` for any
    ``cap`` batches of a device together, the blanket's exact analysis (``"analysis": "blanket"``).

    ``separate``: the shuffler runs as its own service (:mod:`pipeline.modes.local.shuffler_service`) and the reports are
    sealed to the analyzer; otherwise it runs in the operator's worker.
    """
    eps, delta, n = config.epsilon, config.delta, config.shuffle_batch
    if config.codewords:  # the blanket: a central guarantee over cap batches, none per report
        local: dict[str, Any] = {"epsilon": None, "delta": 0.0, "analysis": "blanket",
                                 "kind": "none: the blanket protocol has no local guarantee (a device's codeword is "
                                         "among its own fakes, in the clear to whoever opens its messages)"}
        central: dict[str, Any] = {"epsilon": eps, "delta": delta, "analysis": "blanket", "batches": config.cap,
                                   "kind": f"central DP of any {config.cap} shuffled batches of {n} distinct users "
                                           f"of one device together (the blanket's exact analysis, Balcer & Cheu: "
                                           f"models.local.items); ceil(k / {config.cap}) times that for k batches"}
    else:
        e0 = config.epsilon0
        local = {"epsilon": e0, "delta": 0.0, "kind": "local DP per report (k reports: k x epsilon0)"}
        central = {"epsilon": eps, "delta": delta, "kind": f"central DP per shuffled batch of {n} distinct users "
                                                          f"(Feldman, McMillan & Talwar)"}
    if not separate:
        why = ("the shuffler runs inside the operator's worker and POST /report hands it each report with its user "
               "id: against the operator each report is only its local guarantee")
        return {"shuffler": "in the operator's worker", "analyzer_operator": {**local, "why": why},
                "shuffler_operator": {**local, "why": why}, "colluding": {**local, "why": why},
                "everyone_else": {**central, "why": "they see only the released statistics of shuffled batches"}}
    return {
        "shuffler": "a separate service (own process, port, Redis user and keys); devices seal each report's "
                    "content to the analyzer's P-256 key (ECDH, HKDF-SHA256, AES-256-GCM)",
        "analyzer_operator": {**central, "why": "the analyzer (with the web server: the operator) opens contents but "
                              "receives them stripped of identity and shuffled among n distinct users; valid while "
                              "the shuffler is honest and the other n - 1 reports of a batch come from real devices "
                              + ("(an operator who feeds the shuffler its own devices' messages knows their fakes: "
                                 "the blanket shrinks to the honest devices' n - c, models.local.items)"
                                 if config.codewords else "(an operator who feeds the shuffler its own devices' "
                                 "reports shrinks the crowd down to epsilon0)")},
        "shuffler_operator": {"epsilon": 0.0, "delta": 0.0, "kind": "cryptographic (no content seen)",
                              "why": "the shuffler sees who reports, when, their report counter and the list "
                                     "answered (public in every mode), never a content: it holds no key that opens "
                                     "one (semantic security of ECIES, not a DP bound)"},
        "colluding": {**local, "why": "the analyzer's key with the shuffler's identities opens each user's own "
                                      "report: only the device's noise protects it" + (
                                          " (with codewords there is none)" if config.codewords else "")},
        "everyone_else": {**central, "why": "they see only the released statistics of shuffled batches"},
    }
