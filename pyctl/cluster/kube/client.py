"""The connection to a Kubernetes API server: a kubernetes-asyncio `ApiClient` built from in-cluster
config or a kubeconfig (the caller says which), with a client-side timeout on every request, and
raw requests that return bytes (no generated model classes; `decode.py` reads the bytes).

Every request through `KubeClient` (and every call of a generated API on `KubeClient.api`) has a
connect and a read timeout: kubernetes-asyncio sends requests without any unless told
(`shared/docs/control_plane.md` §11.2).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypedDict
from urllib.parse import quote

import aiohttp
import anyio
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from pyctl import safe_yaml
from pyctl.cluster.bounds import MAX_INPUT_BYTES
from pyctl.cluster.source import ActuatorError
from pyctl.jsontypes import JsonObject

#: What a request, or a stream being read, can fail with when the connection is the problem.
CONNECTION_ERRORS: Final = (aiohttp.ClientError, TimeoutError, OSError)

Query = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Timeouts:
    """Client-side timeouts, in seconds. `read` bounds each wait for data (aiohttp's
    `sock_read`), `total` a whole ordinary request; watches have no total, and a read timeout a
    little above their server-side `timeoutSeconds`."""

    connect: float = 5.0
    read: float = 30.0
    total: float = 60.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "total"):
            if not getattr(self, name) > 0:
                raise ValueError(f"timeouts.{name} must be > 0, got {getattr(self, name)!r}")

    def request(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self.total, connect=self.connect, sock_connect=self.connect, sock_read=self.read
        )

    def stream(self, read: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=None, connect=self.connect, sock_connect=self.connect, sock_read=read
        )


class _TimeoutApiClient(k8s.ApiClient):
    """An ApiClient whose requests get the default timeouts unless the caller gives its own."""

    def __init__(self, configuration: Any, timeouts: Timeouts) -> None:
        super().__init__(configuration)
        self.pyctl_timeouts = timeouts

    def request(self, *args: Any, **kw: Any) -> Any:
        if kw.get("_request_timeout") is None:
            kw["_request_timeout"] = self.pyctl_timeouts.request()
        return super().request(*args, **kw)


class KubeApiError(ActuatorError):
    """A request the API server answered with an error status; `reason` and `message` come from
    its `Status` body when it has one (`NotFound`, `Conflict`, `TooManyRequests`, ...)."""

    def __init__(self, status: int, reason: str, message: str, details: Mapping[str, Any]) -> None:
        super().__init__(status, f"{status} {reason}: {message}")
        self.reason = reason
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Response:
    status: int
    data: bytes
    headers: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self) -> KubeApiError:
        return api_error(self.status, self.data)

    def check(self) -> Response:
        """Self if the status is 2xx, else raise `KubeApiError`."""
        if not self.ok:
            raise self.error()
        return self

    def json(self) -> Any:
        return json.loads(self.data)


def api_error(status: int, data: bytes) -> KubeApiError:
    """The error of a non-2xx answer, read from its `Status` body if it is one."""
    reason, message = "", ""
    details: JsonObject = {}
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        reason = str(body.get("reason", ""))
        message = str(body.get("message", ""))
        got = body.get("details")
        details = got if isinstance(got, dict) else {}
    else:
        message = data[:300].decode(errors="replace")
    return KubeApiError(status, reason, message, details)


def path_part(name: str) -> str:
    """A name as one URL path segment."""
    return quote(name, safe="")


class KubeClient:
    """An API server connection: `request` (bytes in, bytes out) and `stream` (a watch)."""

    def __init__(self, api: Any, timeouts: Timeouts) -> None:
        #: the underlying kubernetes-asyncio ApiClient, for code that wants the generated APIs
        self.api = api
        self.timeouts = timeouts

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> Response:
        """One request; the whole body is read. Non-2xx statuses are returned, not raised;
        connection problems and timeouts raise (`CONNECTION_ERRORS`)."""
        resp = await self._send(method, path, query, body, content_type, client_timeout)
        try:
            data = await resp.read()
            return Response(resp.status, data, dict(resp.headers))
        finally:
            resp.release()

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Query = (), read_timeout: float
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it comes (a watch). The caller checks `status` and reads
        `content`; the connection is closed on exit (a watch is never reused)."""
        resp = await self._send("GET", path, query, None, "", self.timeouts.stream(read_timeout))
        try:
            yield resp
        finally:
            resp.close()

    async def _send(
        self,
        method: str,
        path: str,
        query: Query,
        body: Mapping[str, Any] | None,
        content_type: str,
        client_timeout: aiohttp.ClientTimeout | None,
    ) -> aiohttp.ClientResponse:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            method,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,  # the raw aiohttp response: no model classes, no decoding
            _request_timeout=client_timeout or self.timeouts.request(),
        )
        return resp

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _InClusterPaths(TypedDict, total=False):
    """Where kubernetes-asyncio's in-cluster loader looks, when not its defaults."""

    token_filename: str
    cert_filename: str
    environ: dict[str, str]


async def connect(
    *,
    kubeconfig: str | Path | None = None,
    context: str | None = None,
    in_cluster: bool = False,
    token_file: str | Path | None = None,
    ca_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    timeouts: Timeouts | None = None,
) -> KubeClient:
    """A client from a kubeconfig file (`kubeconfig`, optionally `context`) or from the pod's
    service account (`in_cluster=True`; `token_file`/`ca_file`/`environ` override where
    kubernetes-asyncio's in-cluster loader looks, for tests). Exactly one of the two.

    Nothing else is read from the environment; the kubeconfig is never written back."""
    if (kubeconfig is None) == (not in_cluster):
        raise ValueError("connect: pass exactly one of kubeconfig=PATH or in_cluster=True")
    timeouts = timeouts or Timeouts()
    cfg = k8s.Configuration()
    if in_cluster:
        kw: _InClusterPaths = {}
        if token_file is not None:
            kw["token_filename"] = str(token_file)
        if ca_file is not None:
            kw["cert_filename"] = str(ca_file)
        if environ is not None:
            kw["environ"] = dict(environ)
        k8s_config.load_incluster_config(client_configuration=cfg, **kw)  # type: ignore[no-untyped-call]
    else:
        where = f"kubeconfig {kubeconfig}"
        try:
            if (await anyio.Path(str(kubeconfig)).stat()).st_size > MAX_INPUT_BYTES:
                raise KubeConfigError(f"{where}: larger than {MAX_INPUT_BYTES} bytes")
            # read first by pyctl's YAML loader: an alias bomb (1 KB standing for a billion
            # entries, walked by the loader below and by its messages) or a key given twice is
            # refused with the line (kubectl's YAML refuses keys given twice too)
            text = await anyio.Path(str(kubeconfig)).read_text(encoding="utf-8")
            safe_yaml.load(text, where)
            await k8s_config.load_kube_config(
                config_file=str(kubeconfig),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except KubeConfigError:
            raise
        except safe_yaml.YamlInputError as e:
            raise KubeConfigError(str(e)) from None
        except UnicodeDecodeError:
            raise KubeConfigError(f"{where}: not UTF-8 text") from None
        except OSError as e:
            raise KubeConfigError(f"{where}: cannot read: {e.strerror or e}") from None
        except RecursionError:
            raise KubeConfigError(f"{where}: nested too deeply") from None
        except Exception as e:  # whatever the loader makes of a bad file: not a kubeconfig
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KubeConfigError(f"{where}: not a usable kubeconfig: {first}") from None
    return KubeClient(_TimeoutApiClient(cfg, timeouts), timeouts)


class KubeConfigError(ValueError):
    """A kubeconfig that cannot be read or used; the message names the file."""
