"""The Redis connection: its configuration, the client it makes (single Redis or Redis Cluster),
the Lua scripts it runs, and the mapping of every redis-py failure to a `StoreError`.

Shared by the state store, the rate limiter and the workflow store, which all take a client made
here (one client per process is enough; each holds a connection pool).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from pyctl.state.keys import DEFAULT_PREFIX, validate_prefix
from pyctl.state.store import SchemaError, StateLostError, StoreError, StoreUnreachable

RedisClient: TypeAlias = "Redis | RedisCluster"

#: Every command pyctl sends (directly, or from its Lua scripts, which Redis checks as well): a
#: least-privilege ACL user needs these and the key pattern ``<prefix>:*``. (redis-py also sends
#: CLIENT SETINFO on Redis >= 7.2 and ignores a refusal.)
REDIS_COMMANDS = (
    "eval", "evalsha", "time", "get", "set", "exists", "type", "unlink", "expire", "pexpire",
    "persist", "incrby", "hset", "hget", "hmget", "hgetall", "hdel", "zadd", "zrem", "zscore",
    "zrange", "zrangebyscore", "zcount", "zremrangebyscore", "client|setname",
)  # fmt: skip

#: Error replies raised by pyctl's own Lua scripts (`redis.error_reply`): the first word.
SCHEMA_MISMATCH = "PYCTL_SCHEMA"
STATE_LOST = "PYCTL_LOST"
WRONG_TYPE = "PYCTL_WRONGTYPE"


@dataclass(frozen=True)
class RedisConfig:
    """How to reach Redis. Read once at start (from flags, environment or a file) and passed down.

    `url` is ``redis://[user[:password]@]host[:port][/db]`` or ``rediss://...`` (TLS). In cluster
    mode it names any one node (the others are discovered) and the db must be 0. `username` and
    `password`, when set, take precedence over the URL's. Timeouts are always set: a Redis that
    stops answering makes calls fail after `socket_timeout` instead of hanging.
    """

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    ssl_ca_file: str | None = None
    ssl_cert_file: str | None = None
    ssl_key_file: str | None = None
    ssl_check_hostname: bool = True
    socket_timeout: float = 5.0
    connect_timeout: float = 2.0
    #: retries of a command after a connection error or timeout (exponential backoff)
    retries: int = 2
    retry_backoff_base: float = 0.05
    retry_backoff_cap: float = 1.0
    key_prefix: str = DEFAULT_PREFIX
    #: how long a federation member's last summary stays readable (stale) after it was published
    summary_retention_seconds: int = 7 * 86400
    client_name: str = "pyctl"

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"redis url {self.url!r}: scheme must be redis:// or rediss://")
        if not parts.hostname:
            raise ValueError(f"redis url {self.url!r}: no host")
        try:
            parts.port  # noqa: B018 (parsing raises on a bad port)
        except ValueError as exc:
            raise ValueError(f"redis url {self.url!r}: bad port ({exc})") from None
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ValueError(f"redis url {self.url!r}: the path must be a database number")
        if self.cluster and db not in ("", "0"):
            raise ValueError(f"redis url {self.url!r}: Redis Cluster has only database 0")
        for name in ("socket_timeout", "connect_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"redis {name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"redis retries must be an integer >= 0, got {self.retries!r}")
        if not (0 < self.retry_backoff_base <= self.retry_backoff_cap):
            raise ValueError("redis retry backoff: need 0 < retry_backoff_base <= cap")
        retention = self.summary_retention_seconds
        if not isinstance(retention, int) or retention < 1:
            raise ValueError("redis summary_retention_seconds must be an integer >= 1")
        validate_prefix(self.key_prefix)
        for name in ("ssl_ca_file", "ssl_cert_file", "ssl_key_file"):
            if getattr(self, name) is not None and not self.tls:
                raise ValueError(f"redis {name} is set but TLS is off (set ssl or use rediss://)")
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError("redis ssl_cert_file and ssl_key_file go together")

    @property
    def tls(self) -> bool:
        return self.ssl or self.url.startswith("rediss://")

    def describe(self) -> str:
        """Where Redis is, for messages: the URL without its password, and the mode."""
        parts = urlsplit(self.url)
        user = self.username or (unquote(parts.username) if parts.username else "")
        host = parts.hostname or "?"
        if ":" in host:
            host = f"[{host}]"
        where = f"{'rediss' if self.tls else 'redis'}://{user + '@' if user else ''}{host}"
        where += f":{parts.port or 6379}"
        return where + (" (cluster)" if self.cluster else "")


def connect(config: RedisConfig) -> RedisClient:
    """A client for `config` (no I/O yet: connections are made on first use)."""
    parts = urlsplit(config.url)
    username = config.username
    if username is None and parts.username:
        username = unquote(parts.username)
    password = config.password
    if password is None and parts.password:
        password = unquote(parts.password)
    common: dict[str, Any] = {
        "host": parts.hostname,
        "port": parts.port or 6379,
        "username": username,
        "password": password,
        "socket_timeout": config.socket_timeout,
        "socket_connect_timeout": config.connect_timeout,
        "retry": Retry(
            ExponentialBackoff(cap=config.retry_backoff_cap, base=config.retry_backoff_base),
            config.retries,
        ),
        "decode_responses": False,
        "client_name": config.client_name,
    }
    if config.tls:
        common.update(
            ssl=True,
            ssl_ca_certs=config.ssl_ca_file,
            ssl_certfile=config.ssl_cert_file,
            ssl_keyfile=config.ssl_key_file,
            ssl_check_hostname=config.ssl_check_hostname,
        )
    if config.cluster:
        return RedisCluster(**common)
    db = parts.path.strip("/")
    return Redis(db=int(db or 0), **common)


async def release_idle(client: RedisClient) -> None:
    """Close the client's idle connections (they are opened again on use; never raises). An
    outage leaves more than the client needs: the retries' connections in the pool, and with
    Redis Cluster the connections its rediscovery opened to every node (`CLUSTER SLOTS`), while
    pyctl's keys live on one node. Called once the store answers again after an outage, so that
    the process's connections and file descriptors come back to what it uses."""
    with suppress(rexc.RedisError, rexc.RedisClusterException, OSError):
        if isinstance(client, RedisCluster):
            for node in client.get_nodes():
                await node.disconnect_free_connections()
        else:
            await client.connection_pool.disconnect(inuse_connections=False)


async def close_client(client: RedisClient) -> None:
    """Close a client and its connections (never raises a redis error)."""
    with suppress(rexc.RedisError, rexc.RedisClusterException, OSError):
        await client.aclose()


def _first_word(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.split(" ", 1)[0] if text else ""


def store_error(exc: BaseException, op: str, where: str, timeout: float) -> StoreError:
    """The `StoreError` that says, in words, what a redis-py (or socket) failure means."""
    msg = str(exc).strip() or type(exc).__name__
    if isinstance(exc, rexc.ResponseError):
        word = _first_word(exc)
        if word == SCHEMA_MISMATCH:
            return SchemaError(msg.split(" ", 1)[1] if " " in msg else msg)
        if word == STATE_LOST:
            return StateLostError(
                f"{op}: redis at {where} has lost pyctl's state (schema key missing: restarted "
                "without persistence, flushed or evicted); reopen the store and relist"
            )
        if word == WRONG_TYPE:
            return StoreError(f"{op}: {msg.split(' ', 1)[-1]} (nothing was written)")
    if isinstance(exc, rexc.AuthenticationError | rexc.AuthenticationWrongNumberOfArgsError):
        return StoreError(
            f"{op}: redis at {where} refused authentication ({msg}); check the username and "
            "password"
        )
    if isinstance(exc, rexc.NoPermissionError):
        return StoreError(f"{op}: redis at {where} denied a command to this user ({msg})")
    if isinstance(exc, rexc.TimeoutError | TimeoutError):
        return StoreUnreachable(
            f"{op}: redis at {where} did not answer within {timeout:g}s ({msg})"
        )
    if isinstance(exc, rexc.OutOfMemoryError):
        return StoreError(f"{op}: redis at {where} is out of memory (maxmemory): {msg}")
    if isinstance(exc, rexc.BusyLoadingError):
        return StoreUnreachable(f"{op}: redis at {where} is still loading its dataset; retry later")
    if isinstance(exc, rexc.ConnectionError | OSError | rexc.ClusterDownError):
        return StoreUnreachable(f"{op}: cannot reach redis at {where}: {msg}")
    if isinstance(exc, rexc.ResponseError):
        return StoreError(f"{op}: redis at {where} refused the command: {msg}")
    if isinstance(exc, rexc.RedisClusterException):
        return StoreError(f"{op}: redis cluster at {where}: {msg}")
    return StoreError(f"{op}: redis at {where}: {type(exc).__name__}: {msg}")


#: What `redis_errors` converts (never CancelledError or KeyboardInterrupt).
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    rexc.RedisError,
    rexc.RedisClusterException,
    OSError,
    TimeoutError,
    asyncio.TimeoutError,
)


@asynccontextmanager
async def redis_errors(op: str, config: RedisConfig) -> AsyncIterator[None]:
    """Run a block of redis calls; any failure in it leaves as a `StoreError` (the original is
    chained). Besides redis-py's and the socket's errors, that includes anything else redis-py
    raises from its internals, and replies that do not parse: the caller's answer to all of
    them is the same (the store failed; retry later)."""
    try:
        yield
    except StoreError:
        raise
    except REDIS_FAILURES as exc:
        raise store_error(exc, op, config.describe(), config.socket_timeout) from exc
    except Exception as exc:
        raise StoreError(
            f"{op}: redis client failed unexpectedly ({config.describe()}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc


async def ready(client: RedisClient) -> RedisClient:
    """The client, ready for concurrent use. A Redis Cluster client discovers the cluster on
    first use, and with redis-py 8.1 several commands that are first at once can fail
    (AttributeError inside the connection: seen here with as few as 5); initializing it first
    avoids that. A no-op once initialized (a flag check) and for a single Redis."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    return client


class Script:
    """A Lua script run by EVALSHA, falling back to EVAL when the server does not have it yet
    (a new or restarted server, or a cluster node that has not seen it): no SCRIPT LOAD round
    to every node, and no state kept in the client."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def __call__(
        self, client: RedisClient, keys: Sequence[str], args: Sequence[str | bytes | int | float]
    ) -> Any:
        await ready(client)
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await client.eval(self.text, len(keys), *keys, *args)
