"""The tokens of the per-user views (:mod:`pipeline.serve.auth`) and where ``privrec up`` keeps them
(:func:`privrec.ops.stackfile.stack_tokens`): pure functions and a temporary directory."""

from __future__ import annotations

import hashlib
import hmac
import stat
from pathlib import Path

import pytest

from pipeline.config.settings import Settings
from pipeline.serve.auth import MIN_LENGTH, OPERATOR_ENV, SECRET_ENV, Tokens, bearer, new_token, user_token
from privrec.ops.stackfile import TOKENS_FILE, child_env, read_tokens, stack_tokens

SECRET = "s" * 40
OPERATOR = "o" * 43


def test_a_users_token_is_the_hmac_sha256_of_their_id() -> None:
    expected = hmac.new(SECRET.encode(), "Zoë".encode(), hashlib.sha256).hexdigest()
    assert user_token(SECRET, "Zoë") == expected and len(expected) == 64
    assert user_token(SECRET, "2") != user_token(SECRET, "3")  # one user's token is not another's
    assert user_token(SECRET, "2") != user_token("t" * 40, "2")  # nor the same user's under another secret


@pytest.mark.parametrize("user", ["2", "", "web-0123", "\ud800", "a" * 10_000], ids=["id", "empty", "web", "surrogate",
                                                                                     "long"])
def test_grant_tells_the_user_the_operator_and_nobody(user: str) -> None:
    tokens = Tokens(secret=SECRET, operator=OPERATOR)
    assert tokens.grant(tokens.for_user(user), user) == "user"
    assert tokens.grant(OPERATOR, user) == "operator"
    assert tokens.grant(tokens.for_user(user + "x"), user) is None
    assert tokens.grant(tokens.for_user(user).upper(), user) is None  # compared byte for byte
    assert tokens.grant(None, user) is None and tokens.grant("", user) is None
    assert tokens.grant("\ud800é", user) is None  # any str is compared (a header may carry anything)


def test_without_an_operator_token_only_the_users_own_opens_their_view() -> None:
    tokens = Tokens(secret=SECRET)
    assert tokens.grant(OPERATOR, "2") is None and not tokens.is_operator(OPERATOR) and not tokens.is_operator(None)
    assert Tokens(secret=SECRET, operator=OPERATOR).is_operator(OPERATOR)


def test_short_secrets_and_operator_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match=f"`secret` \\({SECRET_ENV}\\) must be at least {MIN_LENGTH} characters, got 5"):
        Tokens(secret="short")
    with pytest.raises(ValueError, match=f"`operator` \\({OPERATOR_ENV}\\) must be at least"):
        Tokens(secret=SECRET, operator="x")
    assert len(new_token()) == 43 and new_token() != new_token()  # 32 random bytes, URL-safe base64


def test_the_repr_hides_both_and_the_environment_round_trips() -> None:
    tokens = Tokens(secret=SECRET, operator=OPERATOR)
    assert SECRET not in repr(tokens) and OPERATOR not in repr(tokens) and SECRET not in str(tokens)
    assert Tokens.from_env(tokens.env()) == tokens
    assert Tokens.from_env({OPERATOR_ENV: OPERATOR}) is None  # no secret, no tokens
    assert Tokens.ephemeral().operator is None and Tokens.ephemeral().secret != Tokens.ephemeral().secret


@pytest.mark.parametrize("header, token", [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None),
                                           ("Bearer", None), ("", None), (None, None), ("abc", None)])
def test_bearer(header: str | None, token: str | None) -> None:
    assert bearer(header) == token


def test_privrec_up_makes_the_tokens_once_and_keeps_them_0600(tmp_path: Path) -> None:
    made = stack_tokens(tmp_path, {})
    path = tmp_path / TOKENS_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert made.operator is not None and len(made.secret) >= MIN_LENGTH
    assert stack_tokens(tmp_path, {}) == made == read_tokens(tmp_path)  # the same stack, the same tokens
    given = stack_tokens(tmp_path, {SECRET_ENV: SECRET})  # the environment wins, and is kept
    assert given.secret == SECRET and given.operator == made.operator and read_tokens(tmp_path) == given
    assert read_tokens(tmp_path / "nowhere") is None


def test_only_the_web_server_gets_the_tokens(tmp_path: Path) -> None:
    """``child_env`` (every worker's, the shuffler's and the web's base) drops them even when our environment has
    them; ``privrec up`` adds them to the web server's alone."""
    base = {SECRET_ENV: SECRET, OPERATOR_ENV: OPERATOR, "PATH": "/bin"}
    env = child_env(Settings(), tmp_path, base=base)
    assert SECRET_ENV not in env and OPERATOR_ENV not in env and env["PATH"] == "/bin"
    assert SECRET not in "".join(env.values())


def test_a_web_server_the_supervisor_starts_again_gets_the_tokens_back(tmp_path: Path) -> None:
    from privrec.ops.relaunch import process_env

    tokens = stack_tokens(tmp_path, {})
    stack = {"settings": {}, "redis": "redis://127.0.0.1:6390/0", "state_dir": str(tmp_path)}
    assert Tokens.from_env(process_env(stack, tmp_path, "web")) == tokens
    worker = process_env(stack, tmp_path, "worker-0")
    assert SECRET_ENV not in worker and OPERATOR_ENV not in worker
