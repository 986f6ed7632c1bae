"""Who may read a per-user view: user tokens and the operator token (``Authorization: Bearer <token>``).

A user's token is ``HMAC-SHA256(secret, user id)`` in hex: the server recomputes it from the id, so it keeps no
table of tokens, and nobody without the secret can make one for a user. The operator token (32 random bytes,
URL-safe base64) opens every user's view. Tokens are compared in constant time (:func:`hmac.compare_digest`).

Both come from the web server's environment, ``PRIVREC_TOKEN_SECRET`` and ``PRIVREC_OPERATOR_TOKEN``
(:meth:`Tokens.from_env`). ``privrec up`` makes them once per stack and keeps them in ``<state>/tokens.json``
(mode 0600, :func:`privrec.ops.stackfile.stack_tokens`); only the web server's environment gets them, never a
worker's, never a Redis key, never a log line (their ``repr`` hides them). A web server started without a secret
makes one of its own (:meth:`Tokens.ephemeral`, no operator token): its user tokens then last as long as the
process.

Examples
--------
>>> tokens = Tokens(secret="s" * 32, operator="o" * 43)
>>> tokens.for_user("2") == user_token("s" * 32, "2"), len(tokens.for_user("2"))
(True, 64)
>>> tokens.grant(tokens.for_user("2"), "2"), tokens.grant(tokens.for_user("2"), "3"), tokens.grant("o" * 43, "3")
('user', None, 'operator')
>>> tokens
Tokens(secret=<hidden>, operator=<hidden>)
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SECRET_ENV", "OPERATOR_ENV", "MIN_LENGTH", "Tokens", "user_token", "new_token", "bearer"]

#: The web server's environment variable holding the secret of the user tokens.
SECRET_ENV = "PRIVREC_TOKEN_SECRET"
#: The web server's environment variable holding the operator token.
OPERATOR_ENV = "PRIVREC_OPERATOR_TOKEN"
#: The shortest secret or operator token taken (``new_token`` makes 43 characters: 32 random bytes).
MIN_LENGTH = 32


def new_token() -> str:
    """32 random bytes, URL-safe base64 (43 characters): a secret or an operator token."""
    return secrets.token_urlsafe(32)


def _bytes(text: str) -> bytes:
    # a header or query value may hold any code point, a lone surrogate too: every str has these bytes
    return text.encode("utf-8", "surrogatepass")


def user_token(secret: str, user: str) -> str:
    """``HMAC-SHA256(secret, user id)``, hex: the token that opens ``user``'s per-user views.

    Examples
    --------
    >>> user_token("k" * 32, "2")
    'a4c76d3e1134468d73378d52ea8fe20261cfc5e680b69d376d846c4ef7dd48cb'
    """
    return hmac.new(_bytes(secret), _bytes(user), hashlib.sha256).hexdigest()


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (``None``: no header, another scheme, empty).

    Examples
    --------
    >>> bearer("Bearer abc"), bearer("bearer abc"), bearer("Basic abc"), bearer(None), bearer("Bearer ")
    ('abc', 'abc', None, None, None)
    """
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class Tokens:
    """The web server's secret of the user tokens and its operator token.

    Parameters
    ----------
    secret
        Key of the user tokens' HMAC, at least ``MIN_LENGTH`` characters.
    operator
        The operator token (at least ``MIN_LENGTH`` characters), or ``None``: no operator access.
    """

    secret: str
    operator: str | None = None

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_LENGTH:
            raise ValueError(f"`secret` ({SECRET_ENV}) must be at least {MIN_LENGTH} characters, got "
                             f"{len(self.secret)}.")
        if self.operator is not None and len(self.operator) < MIN_LENGTH:
            raise ValueError(f"`operator` ({OPERATOR_ENV}) must be at least {MIN_LENGTH} characters, got "
                             f"{len(self.operator)}.")

    def __repr__(self) -> str:
        return f"Tokens(secret=<hidden>, operator={'<hidden>' if self.operator else None})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Tokens | None:
        """``PRIVREC_TOKEN_SECRET`` and ``PRIVREC_OPERATOR_TOKEN`` (optional) of ``environ``; ``None`` without a
        secret.

        Examples
        --------
        >>> Tokens.from_env({}) is None, Tokens.from_env({SECRET_ENV: "s" * 32}).operator is None
        (True, True)
        """
        secret = environ.get(SECRET_ENV)
        if not secret:
            return None
        return cls(secret=secret, operator=environ.get(OPERATOR_ENV) or None)

    @classmethod
    def ephemeral(cls) -> Tokens:
        """A fresh secret and no operator token: the tokens of a web server started without ``PRIVREC_TOKEN_SECRET``."""
        return cls(secret=new_token())

    def env(self) -> dict[str, str]:
        """The environment variables that give a web server these tokens (:meth:`from_env` reads them back)."""
        return {SECRET_ENV: self.secret, **({OPERATOR_ENV: self.operator} if self.operator else {})}

    def for_user(self, user: str) -> str:
        """``user``'s token (:func:`user_token`)."""
        return user_token(self.secret, user)

    def grant(self, token: str | None, user: str) -> str | None:
        """Whom ``token`` speaks for at ``user``'s views: ``"user"`` (their own token), ``"operator"``, or ``None``."""
        if not token:
            return None
        given = _bytes(token)
        if hmac.compare_digest(given, _bytes(self.for_user(user))):
            return "user"
        if self.operator is not None and hmac.compare_digest(given, _bytes(self.operator)):
            return "operator"
        return None

    def is_operator(self, token: str | None) -> bool:
        """Whether ``token`` is the operator token."""
        return bool(token) and self.operator is not None and hmac.compare_digest(_bytes(token or ""),
                                                                                  _bytes(self.operator))
