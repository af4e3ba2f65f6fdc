"""The Redis store's credential: ``store.redis_password_file`` names a file read where the
store opens; a server that refuses the client (a wrong password, a denied command) makes
``probe`` raise :class:`store.StoreRefused` (the gateway's readiness and Serve health check,
serve/health.py).  Against the suite's redis-server, with ACL users of their own."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
import redis

from store import StoreConfig, StoreRefused, open_store


def acl_user(redis_url: str, commands: list[str]) -> tuple[str, str]:
    """A user of its own (the server's default user stays as the other tests use it)."""
    name, password = f"rws-test-{secrets.token_hex(4)}", secrets.token_hex(16)
    redis.Redis.from_url(redis_url).acl_setuser(
        name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=commands
    )
    return name, password


def user_url(redis_url: str, user: str) -> str:
    return redis_url.replace("redis://", f"redis://{user}@", 1)


def probe(config: StoreConfig) -> None:
    async def run() -> None:
        store = open_store(config)
        try:
            await store.probe()
        finally:
            await store.close()

    asyncio.run(run())


def test_the_password_file_is_read_and_a_wrong_one_is_refused(redis_server: str, tmp_path: Path):
    user, password = acl_user(redis_server, ["+@all"])
    secret = tmp_path / "redis-password"
    secret.write_text(password + "\n")
    config = StoreConfig(
        backend="redis", redis_url=user_url(redis_server, user), redis_password_file=str(secret)
    )
    probe(config)  # the right password: written
    secret.write_text("not-the-password\n")
    with pytest.raises(StoreRefused, match="refused"):
        probe(config)


def test_a_denied_write_is_refused(redis_server: str, tmp_path: Path):
    user, password = acl_user(redis_server, ["+get"])
    secret = tmp_path / "redis-password"
    secret.write_text(password)
    config = StoreConfig(
        backend="redis", redis_url=user_url(redis_server, user), redis_password_file=str(secret)
    )
    with pytest.raises(StoreRefused, match=r"NOPERM|permission"):
        probe(config)


def test_a_missing_or_empty_password_file_is_a_clear_error(tmp_path: Path):
    missing = StoreConfig(backend="redis", redis_password_file=str(tmp_path / "nope"))
    with pytest.raises(StoreRefused, match=r"redis_password_file .*nope"):
        open_store(missing)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(StoreRefused, match="is empty"):
        open_store(StoreConfig(backend="redis", redis_password_file=str(tmp_path / "empty")))
