"""Fault: Redis going away (issue 36), on the real control plane. `pyctl run --kubeconfig --redis
--mode enforce` as deployed, holding the Lease on a quiet cluster: Redis killed for 20 s. pyctl
lived through it before, but `/readyz` answered 200 the whole time; now it answers 503 with the
reason while Redis is gone, `/healthz` and `/metrics` answer, and once Redis is back (empty)
the mirror is written again and `/readyz` is 200."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
import redis as redis_py
from kubernetes_asyncio import client

from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    create_gpu_nodes,
)
from pyctl.state.keys import Keys
from tests.e2e.conftest import wait_until
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.redis_servers import HOST, RedisServer, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.anyio]

CLUSTER = "outage-e2e"
#: how long Redis stays away (the issue's outage)
OUTAGE = 20.0


def get(port: int, path: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except OSError as e:
        return 0, str(e)


async def test_readyz_says_the_store_is_gone_while_it_is(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    await apply_nrt_crd(api)
    specs = [GpuNodeSpec(f"outage-gpu-{i}") for i in range(2)]
    await create_gpu_nodes(api, specs)
    port = free_port()
    pyctl = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        port,
        tmp_path,
        extra_env={"PYCTL_LEASE_NAME": "pyctl-outage-e2e"},
        cluster=CLUSTER,
    )
    keys = Keys(CLUSTER)

    async def ready() -> tuple[int, str]:
        return await anyio.to_thread.run_sync(get, port, "/readyz")

    def alive() -> None:
        assert pyctl.proc is not None
        code = pyctl.proc.poll()
        assert code is None, f"pyctl run exited with {code}: see {tmp_path}"

    def mirrored() -> bool:
        r = redis_py.Redis(host=HOST, port=redis_server.port, socket_timeout=2)
        try:
            nodes = {
                k.decode() if isinstance(k, bytes) else k for k in r.hkeys(keys.objects("Node"))
            }
            return bool(r.exists(keys.schema)) and {s.name for s in specs} <= nodes
        except redis_py.RedisError:
            return False

    async def leads() -> bool:
        alive()
        text = await anyio.to_thread.run_sync(pyctl.metrics)
        return f'pyctl_leader{{cluster="{CLUSTER}"}} 1.0' in text

    async def is_ready() -> bool:
        alive()
        return await ready() == (200, "ok\n")

    async def not_ready() -> bool:
        alive()
        code, why = await ready()
        return code == 503 and why.startswith("state store unavailable (")

    try:
        pyctl.start("outage-0")
        await wait_until(is_ready, "ready", within=60)
        await wait_until(leads, "the Lease held", within=30)
        await wait_until(mirrored, "the mirror in Redis", within=30)

        redis_server.kill()
        killed = time.monotonic()
        await wait_until(not_ready, "/readyz 503 without Redis", within=10)
        seen = time.monotonic() - killed
        while time.monotonic() - killed < OUTAGE:
            assert await not_ready(), await ready()
            assert await anyio.to_thread.run_sync(get, port, "/healthz") == (200, "ok\n")
            await anyio.sleep(1.0)
        metrics = await anyio.to_thread.run_sync(pyctl.metrics)
        assert f'pyctl_store_up{{cluster="{CLUSTER}"}} 0.0' in metrics

        redis_server.start()  # empty: nothing is persisted
        await wait_until(is_ready, "ready again once Redis is back", within=30)
        assert mirrored()
        assert await leads()
        print(f"/readyz 503 {seen:.1f} s after Redis was killed; 200 again after it returned")
    finally:
        pyctl.kill()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        for spec in specs:
            await core.delete_node(spec.name)
            await custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, spec.name)
