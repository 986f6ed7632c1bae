"""Sealed reports: public-key encryption from a device to the analyzer (Prochlo's *encode* step).

A device seals the contents of its report to the analyzer's public key; the shuffler, which sees who sent
it, holds only the sealed bytes; the analyzer, which holds the private key, opens them after the shuffler
has stripped identities and shuffled. The construction is ECIES over NIST P-256, all of it available both
in the ``cryptography`` package and in the browser's WebCrypto (``pipeline/apps/static/seal.js`` is the twin):

1. an ephemeral key pair ``(e, E)`` per message; ``Z = ECDH(e, A)`` with the analyzer's public key ``A``;
2. ``k = HKDF-SHA256(Z, salt = "", info = LABEL || E || A, 32 bytes)`` (both public keys bound in);
3. ``c = AES-256-GCM(k, nonce, plaintext, aad = LABEL)`` with a random 96-bit nonce;
4. the sealed bytes are ``E (65 bytes, uncompressed point) || nonce (12) || c`` (ciphertext and 16-byte tag).

A fresh key per message makes every ciphertext of the same plaintext different, so nothing but the
private key links a sealed report to its contents. Opening checks the tag: a changed byte, another key
or a truncated message raise :class:`SealError` naming what is wrong, never return garbage.

Examples
--------
>>> key = AnalyzerKey.generate()
>>> sealed = seal(key.public_bytes(), b'{"m": [0.5]}')
>>> len(sealed) == OVERHEAD + len(b'{"m": [0.5]}')
True
>>> key.open(sealed)
b'{"m": [0.5]}'
>>> key.open(sealed[:-1] + bytes([sealed[-1] ^ 1]))
Traceback (most recent call last):
...
models.local.seal.SealError: sealed: authentication failed (another key, or the bytes were changed)

References
----------
Bittau et al., "Prochlo: Strong Privacy for Analytics in the Crowd", SOSP 2017 (the encode-shuffle-analyze
split); SEC 1 v2 §5.1 (ECIES); RFC 5869 (HKDF); NIST SP 800-38D (GCM).
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["LABEL", "OVERHEAD", "POINT_BYTES", "NONCE_BYTES", "TAG_BYTES", "SealError", "AnalyzerKey", "seal",
           "check_sealed", "public_key_from_bytes", "b64encode", "b64decode"]

#: Domain label: HKDF info prefix and the AEAD's associated data.
LABEL = b"privrec.Sealed/1"
#: An uncompressed P-256 point: 0x04 || X (32) || Y (32).
POINT_BYTES = 65
NONCE_BYTES = 12
TAG_BYTES = 16
#: Sealed length minus plaintext length.
OVERHEAD = POINT_BYTES + NONCE_BYTES + TAG_BYTES
_CURVE = ec.SECP256R1()


class SealError(ValueError):
    """Sealed bytes that cannot be opened (or are not even well-formed); the message says why."""


def b64encode(data: bytes) -> str:
    """Standard base64 with padding (what ``btoa`` gives in the browser)."""
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str, *, what: str = "sealed") -> bytes:
    """Strict base64 (``SealError`` naming ``what`` if it is not)."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as e:
        raise SealError(f"{what}: not base64 ({e})") from None


def public_key_from_bytes(raw: bytes) -> ec.EllipticCurvePublicKey:
    """A P-256 public key from its 65-byte uncompressed encoding (the point must lie on the curve)."""
    if len(raw) != POINT_BYTES or raw[0] != 4:
        raise SealError(f"public key: must be a {POINT_BYTES}-byte uncompressed P-256 point (0x04 || X || Y), got "
                        f"{len(raw)} bytes")
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(_CURVE, raw)
    except ValueError:
        raise SealError("public key: not a point of P-256") from None


def _point(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)


def _key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=LABEL + ephemeral + recipient).derive(shared)


def seal(public_key: bytes, plaintext: bytes) -> bytes:
    """Seal ``plaintext`` to the analyzer's ``public_key`` (65-byte uncompressed P-256 point).

    Returns ``E || nonce || ciphertext+tag`` (:data:`OVERHEAD` bytes longer than the plaintext).
    """
    recipient = public_key_from_bytes(public_key)
    eph = ec.generate_private_key(_CURVE)
    e_pub = _point(eph.public_key())
    k = _key(eph.exchange(ec.ECDH(), recipient), e_pub, public_key)
    nonce = os.urandom(NONCE_BYTES)
    return e_pub + nonce + AESGCM(k).encrypt(nonce, plaintext, LABEL)


def check_sealed(sealed: bytes, *, max_bytes: int = 1 << 16) -> None:
    """What the shuffler can check without the key: the length and the ephemeral point (``SealError`` if not)."""
    if not OVERHEAD < len(sealed) <= max_bytes:
        raise SealError(f"sealed: must be more than {OVERHEAD} and at most {max_bytes} bytes (ephemeral point, "
                        f"nonce, ciphertext and tag), got {len(sealed)}")
    public_key_from_bytes(sealed[:POINT_BYTES])


class AnalyzerKey:
    """The analyzer's key pair: only the analyzer's process loads it (``privrec up`` writes it 0600)."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey) -> None:
        if not isinstance(private_key.curve, ec.SECP256R1):
            raise ValueError(f"`private_key` must be a P-256 key, got {private_key.curve.name}.")
        self._private = private_key
        self._public = _point(private_key.public_key())

    @classmethod
    def generate(cls) -> AnalyzerKey:
        return cls(ec.generate_private_key(_CURVE))

    @classmethod
    def from_pem(cls, pem: bytes) -> AnalyzerKey:
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the analyzer key must be an EC private key (PKCS#8 PEM).")
        return cls(key)

    def to_pem(self) -> bytes:
        """PKCS#8 PEM, unencrypted (the file's permissions protect it)."""
        return self._private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())

    def public_bytes(self) -> bytes:
        """The public key as a 65-byte uncompressed point (what devices seal to)."""
        return self._public

    def open(self, sealed: bytes) -> bytes:
        """The plaintext of ``sealed``; :class:`SealError` if it is malformed or fails authentication."""
        check_sealed(sealed, max_bytes=len(sealed))
        e_pub, nonce, body = sealed[:POINT_BYTES], sealed[POINT_BYTES:POINT_BYTES + NONCE_BYTES], \
            sealed[POINT_BYTES + NONCE_BYTES:]
        k = _key(self._private.exchange(ec.ECDH(), public_key_from_bytes(e_pub)), e_pub, self._public)
        try:
            return AESGCM(k).decrypt(nonce, body, LABEL)
        except InvalidTag:
            raise SealError("sealed: authentication failed (another key, or the bytes were changed)") from None
