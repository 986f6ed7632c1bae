"""Least privilege by default: the Redis ACL users of a stack, as ``privrec up`` sets them (every mode).

Each process class connects as its own user (:mod:`pipeline.config.acl`): ``worker`` (global and local mode) or
``site<i>`` / ``coordinator`` (federated) for the trusted processes, ``web`` for the web server, and the
administrator (``default`` with a password) for the ops commands. Passwords are generated per stack and
kept only in ``<state>/redis-users.json`` (0600); ``stack.json``, ``privrec status`` and the logs show URLs
without them (a process gets its URL with credentials in its environment, readable only by its owner).

* **Embedded Redis**: the users are written to the server's ACL file before it starts
  (:func:`pipeline.config.acl.write_aclfile`), so a redis-server restarted from its AOF has them again.
* **External Redis** with ``--redis-admin-url``: the users ``<namespace>-<role>`` are created with that URL
  (used for nothing else and not stored); ``default`` is left alone.
* **External Redis** without it: ``privrec up`` checks that the users exist and are right; if not it prints the
  exact ``ACL SETUSER`` lines to apply (passwords as SHA-256 hashes) and refuses to start, unless
  ``--no-acl`` (every process then connects as ``redis_url``'s user, and ``/budget`` says serving can read
  trusted state). Federated stacks on an external Redis need ``--redis-admin-url`` (or ``--no-acl``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis

from pipeline.config import acl
from pipeline.config.settings import Settings

from .stackfile import REDIS, OpsError, role_redis_url

__all__ = ["prepare", "enable", "role_of", "role_redis_url"]


def prepare(settings: Settings, state: Path, *, external: bool, no_acl: bool) -> tuple[dict[str, list[str]], dict[str, str]] | None:
    """Before Redis starts: the roles and passwords (``None`` with ``--no-acl``); the embedded Redis's ACL file."""
    aclfile = state / REDIS / acl.ACL_FILE
    if no_acl:
        aclfile.unlink(missing_ok=True)  # an earlier stack's users must not lock this one out
        return None
    rules = acl.stack_rules(settings)
    creds = acl.stack_credentials(state, list(rules))
    if not external:
        acl.write_aclfile(state / REDIS, rules, creds)
    return rules, creds


def enable(settings: Settings, plan: tuple[dict[str, list[str]], dict[str, str]] | None, stack: dict[str, Any],
           *, external: bool, admin_url: str | None, note: Callable[[str], None]) -> dict[str, str]:
    """After Redis answers: make sure the users are there; ``{role: url}`` of every role and ``admin``.

    Raises
    ------
    OpsError
        External Redis without ``--redis-admin-url`` whose users are missing or wrong (the message lists the
        ``ACL SETUSER`` lines to apply), or a federated stack on an external Redis without it.
    """
    url = settings.redis_url
    assert url is not None
    if plan is None:
        stack["redis_acl"] = None
        note("redis    NO ACL (--no-acl): every process connects as "
             + ("Redis's default user" if not external else "the user of `redis_url`")
             + "; serving could read trusted state (/budget says so)")
        return {"admin": url}
    rules, creds = plan
    ns = settings.namespace
    users = {role: acl.user_name(ns, role, external=external) for role in rules}
    if external and admin_url:
        client = redis.Redis.from_url(admin_url, socket_timeout=10)
        try:
            acl.apply_acl(client, rules, creds, namespace=ns, external=True)
        except redis.RedisError as exc:
            raise OpsError(f"cannot create the ACL users with --redis-admin-url: {type(exc).__name__}: {exc}") from exc
        finally:
            client.close()
    elif external:
        if settings.mode == "federated":
            raise OpsError("a federated stack on an external Redis needs --redis-admin-url (an administrator's URL, to "
                           "create one user per site, the coordinator and the web), or --no-acl")
        problems = acl.check_users(url, ns, rules, creds, trusted_key=f"{ns}:trusted:acl-check")
        if problems:
            lines = "\n".join(acl.acl_lines(ns, rules, creds))
            raise OpsError(f"the Redis users of this stack are not there or not right ({'; '.join(problems)}). Apply "
                           f"these lines as an administrator of {url} (e.g. redis-cli), then run `privrec up` again "
                           f"(or give --redis-admin-url to let it create them, or --no-acl to run without them):\n"
                           f"{lines}")
    stack["redis_acl"] = {"users": users, "credentials": acl.ROLES_FILE, "external": external}
    urls = {role: acl.role_url(url, users[role], creds[role]) for role in rules}
    if not external:
        urls["admin"] = acl.role_url(url, "default", creds["default"])
    else:  # during `up` only: the given administrator, else the worker (later: role_redis_url)
        urls["admin"] = admin_url or urls["worker"]
    note(f"redis    ACL users {', '.join(users[r] for r in sorted(rules))} (passwords in "
         f"{Path(stack['state_dir']) / acl.ROLES_FILE}, owner-only)")
    return urls


def role_of(name: str) -> str:
    """The Redis role of the process ``name``: ``worker-<i>`` -> ``worker``, ``site-<i>`` -> ``site<i>``, ``web``,
    ``coordinator``."""
    if name.startswith("worker-"):
        return "worker"
    if name.startswith("site-"):
        return "site" + name.split("-", 1)[1]
    return name


