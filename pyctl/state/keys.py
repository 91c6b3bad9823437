"""The Redis key schema: every key pyctl writes, and why it is named so.

One cluster's keys all carry the cluster name in a hash tag, ``<prefix>:{<cluster>}:...``
(prefix ``pyctl`` by default). Redis Cluster hashes only the part between the first ``{`` and the
next ``}``, so all of one cluster's keys live on one slot, hence on one node: a Lua script or a
MULTI/EXEC transaction may touch any of them together, which is how every multi-key update is
made atomic. A cluster name may therefore hold neither ``{`` nor ``}``.

Per cluster ``c`` (``P`` is the prefix)::

    P:{c}:schema                  string  the schema version the state was written with
    P:{c}:rv                      hash    Kind -> resourceVersion the stored objects are at
    P:{c}:written                 hash    Kind -> when it was last written (Redis TIME, seconds)
    P:{c}:obj:<Kind>              hash    record key (name, or namespace/name) -> encoded record
                                          (msgspec JSON array, `pyctl.cluster.records`)
    P:{c}:quarantine:obj:<Kind>   hash    record key -> a stored record that did not decode
    P:{c}:quarantine:obj:<Kind>:reason  hash  record key -> why it was moved aside
    P:{c}:summary                 hash    data (the federation summary), published (Redis TIME,
                                          seconds), ttl (seconds it is fresh for)
    P:{c}:wf:data                 hash    workflow id -> workflow record (bytes)
    P:{c}:wf:version              hash    workflow id -> version (compare-and-set)
    P:{c}:wf:quarantine           hash    workflow id -> a record that did not decode (as stored)
    P:{c}:wf:quarantine:reason    hash    workflow id -> why it was moved aside
    P:{c}:rl:bucket:<name>        hash    token bucket: tokens, ts (ms); expires once full again
    P:{c}:rl:cooldown:<name>      string  present while <name> (a node) is cooling down (PX)
    P:{c}:rl:slots:<name>         zset    semaphore: holder -> expiry (ms)
    P:{c}:rl:budget:<name>        zset    sliding window: unique entry -> time spent (ms)
    P:{c}:rl:budget:<name>:seq    string  counter that makes budget entries unique

Shared by every cluster using the same Redis::

    P:federation:members          zset    cluster name -> last heartbeat (Redis TIME, seconds)

The members index is deliberately outside every cluster's hash tag: it spans clusters, so it
cannot live on any one cluster's slot (a key with ``{c1}`` and one with ``{c2}`` are cross-slot).
It is written with its own command after the summary, never inside a cluster's transaction; it is
only an index (who to look at), the summary itself stays on its cluster's slot.

The rate-limit keys are built for a *scope* rather than a cluster: by default a cluster's own
name, so its limits are its own; clusters that are to share limits (a fleet on one Redis) use one
scope name, and then all their limit keys share that scope's slot.
"""

from __future__ import annotations

from pyctl.cluster.records import Kind

DEFAULT_PREFIX = "pyctl"


def validate_name(name: str, what: str = "cluster name") -> str:
    """A cluster (or scope) name usable in a hash tag; raises ValueError saying what is wrong."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if "{" in name or "}" in name:
        raise ValueError(
            f"{what} {name!r} must not contain '{{' or '}}': it is used as a Redis hash tag"
        )
    if any(ch.isspace() or not ch.isprintable() for ch in name):
        raise ValueError(f"{what} {name!r} must not contain whitespace or control characters")
    return name


def validate_prefix(prefix: str) -> str:
    """A key prefix: it comes before the hash tag, so it must not contain a brace either."""
    return validate_name(prefix, "key prefix")


def members_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The cross-cluster index of federation members (outside any cluster's slot)."""
    return f"{validate_prefix(prefix)}:federation:members"


class Keys:
    """The key names of one cluster (or rate-limit scope) under one prefix."""

    __slots__ = ("base", "cluster", "prefix")

    def __init__(self, cluster: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.cluster = validate_name(cluster)
        self.prefix = validate_prefix(prefix)
        self.base = f"{self.prefix}:{{{self.cluster}}}"

    @property
    def hash_tag(self) -> str:
        return f"{{{self.cluster}}}"

    @property
    def schema(self) -> str:
        return f"{self.base}:schema"

    @property
    def resource_versions(self) -> str:
        return f"{self.base}:rv"

    @property
    def written(self) -> str:
        return f"{self.base}:written"

    def objects(self, kind: Kind) -> str:
        return f"{self.base}:obj:{kind}"

    def objects_quarantine(self, kind: Kind) -> str:
        return f"{self.base}:quarantine:obj:{kind}"

    def objects_quarantine_reasons(self, kind: Kind) -> str:
        return f"{self.base}:quarantine:obj:{kind}:reason"

    @property
    def summary(self) -> str:
        return f"{self.base}:summary"

    @property
    def members(self) -> str:
        return members_key(self.prefix)

    @property
    def workflow_data(self) -> str:
        return f"{self.base}:wf:data"

    @property
    def workflow_versions(self) -> str:
        return f"{self.base}:wf:version"

    @property
    def workflow_quarantine(self) -> str:
        return f"{self.base}:wf:quarantine"

    @property
    def workflow_quarantine_reasons(self) -> str:
        return f"{self.base}:wf:quarantine:reason"

    def bucket(self, name: str) -> str:
        return f"{self.base}:rl:bucket:{name}"

    def cooldown(self, name: str) -> str:
        return f"{self.base}:rl:cooldown:{name}"

    def slots(self, name: str) -> str:
        return f"{self.base}:rl:slots:{name}"

    def budget(self, name: str) -> str:
        return f"{self.base}:rl:budget:{name}"

    def budget_seq(self, name: str) -> str:
        return f"{self.base}:rl:budget:{name}:seq"

    def refund(self, receipt: str) -> str:
        return f"{self.base}:rl:refund:{receipt}"

    @property
    def pattern(self) -> str:
        """A SCAN/KEYS pattern matching every key of this cluster (glob-escaped)."""
        escaped = "".join(f"\\{ch}" if ch in "*?[]\\{}" else ch for ch in self.base)
        return f"{escaped}:*"
