"""A real Kubernetes control plane on this machine, in the spirit of controller-runtime's envtest:
what `pyctl dev up` runs, and what the e2e tests run.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (which plays the kubelets of
fake nodes) run as local processes on free 127.0.0.1 ports, with certificates made by the openssl
CLI. The binaries come from ``scripts/control-plane build`` (cached outside the repository, in a
checkout of pyctl's repository), which also builds the kubectl and helm the deployment is tested
with.

With ``audit=True`` the API server writes an audit log (JSON lines, ``audit.log`` in the work
directory) of every request made with a ServiceAccount token, at Metadata level, and nothing else:
the least-privilege test reads the calls of pyctl's ServiceAccount from it.

Everything here is synchronous (plain ``subprocess`` and ``urllib``), so a session-scoped pytest
fixture can own it while the tests themselves are async.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import functools
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Self

from pyctl.jsontypes import JsonObject, as_object

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "control-plane"

ETCD = "etcd"
APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KWOK = "kwok"
COMPONENTS = (ETCD, APISERVER, CONTROLLER_MANAGER, SCHEDULER, KWOK)

# The annotation kwok selects the nodes it plays the kubelet for.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

# Controllers the tests need: Deployments/ReplicaSets make pods, disruption computes PDB status (the
# apiserver's eviction handler refuses every covered eviction until it has), the garbage collector
# cascades deletes, the namespace controller lets namespace deletion finish.
KCM_CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "disruption-controller",
    "garbage-collector-controller",
    "namespace-controller",
    # creates a pod's ResourceClaims from its ResourceClaimTemplates (DRA)
    "resourceclaim-controller",
)

LOG_TAIL_LINES = 25

#: The audit policy of ``ControlPlane(audit=True)``: requests made with a ServiceAccount token at
#: Metadata level (who, verb, resource, namespace, name, response code), once each (no
#: RequestReceived stage); everything else (the components and tests act with certificates) at
#: None, so auditing costs the other requests nothing.
AUDIT_POLICY: JsonObject = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


class ControlPlaneError(RuntimeError):
    """A component could not be built, started or made ready.

    The message names the component and the reason, and ends with the tail of its log.
    """

    def __init__(self, component: str, reason: str, log: Path | None = None) -> None:
        self.component = component
        self.reason = reason
        self.log = log
        message = f"control plane: {component}: {reason}"
        if log is not None:
            message += f"\n--- last {LOG_TAIL_LINES} lines of {log} ---\n{log_tail(log)}"
        super().__init__(message)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# --------------------------------------------------------------------------------------------------
# Binaries


@dataclass(frozen=True)
class Binaries:
    """Where ``scripts/control-plane`` put the binaries, kwok's stage file, kubectl and helm,
    and Kueue's manager with the part of its config the Kueue e2e reads (`pyctl.dev.kueue`)."""

    bin_dir: Path
    kwok_stages: Path
    versions: Mapping[str, str] = field(default_factory=dict)
    kubectl: Path | None = None
    helm: Path | None = None
    kueue: Path | None = None
    kueue_config: Path | None = None

    def path(self, component: str) -> Path:
        return self.bin_dir / component


def _script_env() -> tuple[int, dict[str, str]]:
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "env"],
        capture_output=True,
        text=True,
        check=False,
    )
    values: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            parsed = shlex.split(value)
            values[key] = parsed[0] if parsed else ""
    return proc.returncode, values


def ensure_binaries(build_log: Path) -> Binaries:
    """Return the built binaries, running ``scripts/control-plane build`` first if they are missing.

    The first build compiles Kubernetes from source (about 11 minutes on 2 cores); its output
    goes to ``build_log``.
    """
    rc, values = _script_env()
    if rc != 0:
        print(
            f"\n[e2e] control-plane binaries missing: running {BUILD_SCRIPT} build "
            f"(first time: about 11 min), log: {build_log}",
            file=sys.__stderr__,
            flush=True,
        )
        build_log.parent.mkdir(parents=True, exist_ok=True)
        with build_log.open("wb") as out:
            build = subprocess.run(
                ["bash", str(BUILD_SCRIPT), "build"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        if build.returncode != 0:
            raise ControlPlaneError(
                "build", f"scripts/control-plane build exited with {build.returncode}", build_log
            )
        rc, values = _script_env()
        if rc != 0:
            raise ControlPlaneError("build", "scripts/control-plane env still says not built")
    return Binaries(
        bin_dir=Path(values["CONTROL_PLANE_BIN"]),
        kwok_stages=Path(values["KWOK_STAGES"]),
        versions={k: v for k, v in values.items() if k.endswith("_VERSION")},
        kubectl=Path(values["KUBECTL"]) if values.get("KUBECTL") else None,
        helm=Path(values["HELM"]) if values.get("HELM") else None,
        kueue=Path(values["KUEUE"]) if values.get("KUEUE") else None,
        kueue_config=Path(values["KUEUE_CONFIG"]) if values.get("KUEUE_CONFIG") else None,
    )


# --------------------------------------------------------------------------------------------------
# Ports and certificates


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (racy, as every such helper is)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @classmethod
    def free(cls, **fixed: int) -> Ports:
        """Free loopback ports, except those given (tests use that to force a clash)."""
        taken: set[int] = set(fixed.values())
        chosen: dict[str, int] = {}
        for name in ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler"):
            if name in fixed:
                chosen[name] = fixed[name]
                continue
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            chosen[name] = port
        return cls(**chosen)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(
            "certificates", f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}"
        )


def make_pki(pki: Path) -> None:
    """A throw-away CA, the apiserver's serving cert, an admin client cert, the SA signing key.

    EC P-256 keys: as good as RSA for the apiserver and an order of magnitude quicker to make.
    """
    pki.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
        "-subj", "/CN=pyctl-e2e-ca", cwd=pki,
    )  # fmt: skip
    leaf = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
    leaf += "authorityKeyIdentifier=keyid\n"
    certs = {
        "apiserver": (
            "/CN=kube-apiserver",
            leaf + "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        ),
        # O=system:masters: the components and the tests act as cluster admin.
        "admin": ("/O=system:masters/CN=pyctl-e2e-admin", leaf + "extendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, ext) in certs.items():
        (pki / f"{name}.ext").write_text(ext)
        _openssl(
            "req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", subject, cwd=pki,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "30", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
            cwd=pki,
        )  # fmt: skip
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-out", "sa.key", cwd=pki,
    )  # fmt: skip
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path) -> None:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": b64("admin.crt"),
                    "client-key-data": b64("admin.key"),
                },
            }
        ],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML


# --------------------------------------------------------------------------------------------------
# Processes

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """If pytest itself is killed, take the component down too (Linux only; best effort)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_setup(nice: int) -> None:  # pragma: no cover - runs in the child
    _die_with_parent()
    if nice:
        os.nice(nice)


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] | None = None
    #: the process's niceness (0: the default priority)
    nice: int = 0
    process: subprocess.Popen[bytes] | None = None
    _log_file: IO[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("ab")
        self._log_file.write(f"$ {shlex.join(self.argv)}\n".encode())
        self._log_file.flush()
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env=dict(self.env) if self.env is not None else None,
                start_new_session=True,  # its own process group: killpg reaches all of it
                preexec_fn=functools.partial(_child_setup, self.nice),
            )
        except OSError as exc:
            self._close_log()
            raise ControlPlaneError(
                self.name, f"cannot execute {self.argv[0]}: {exc.strerror}", self.log
            ) from exc

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace: float = 10.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace)
        # No killpg once the leader is reaped: its pid (the group id) may belong to someone else.
        # None of these binaries forks children.
        self._close_log()

    def kill(self, grace: float = 10.0) -> None:
        """SIGKILL the component (a crash: no graceful shutdown) and close its log."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=grace)
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


# How each component says why it gives up: klog's "command failed" and F-level lines, etcd's and
# kwok's JSON logs, cobra's "Error: ..." (unknown flags).
_FATAL = re.compile(r'"command failed"|^F\d{4} |"level":"fatal"|"msg":"Execute exit"|^Error: ')


def _fatal_line(log: Path) -> str | None:
    for line in reversed(log_tail(log, 60).splitlines()):
        if _FATAL.search(line):
            return line.strip()[:400]
    return None


def _explain_exit(component: Component, code: int) -> str:
    """Why a component exited: a short hint for the usual causes, then its own last word."""
    tail = log_tail(component.log, 60).lower()
    hints = [
        ("address already in use", "a port it needs is already in use"),
        ("unknown flag", "it rejected a command-line flag"),
        ("permission denied", "permission denied"),
        ("no such file or directory", "a file it needs is missing"),
    ]
    reason = f"exited with code {code}"
    for needle, hint in hints:
        if needle in tail:
            reason += f": {hint} ({needle!r} in its log)"
            break
    fatal = _fatal_line(component.log)
    if fatal is not None:
        reason += f"\n  its last word: {fatal}"
    return reason


# --------------------------------------------------------------------------------------------------
# The control plane


class ControlPlane:
    """Start/stop etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

    ``start()`` raises :class:`ControlPlaneError` naming the component that failed (after stopping
    whatever it had started); ``stop()`` is idempotent and also runs at interpreter exit.
    """

    def __init__(
        self,
        binaries: Binaries,
        work_dir: Path,
        *,
        ports: Ports | None = None,
        timeout: float = 60.0,
        components: tuple[str, ...] = COMPONENTS,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        audit: bool = False,
        nice: int = 0,
    ) -> None:
        self.binaries = binaries
        self.work_dir = work_dir
        self.ports = ports or Ports.free()
        self.timeout = timeout
        self.wanted = components
        # Per component: "--flag=value" items that replace the default flag of the same name, or are
        # added (e.g. {"kube-apiserver": ["--min-request-timeout=30"]}).
        self.extra_args = extra_args or {}
        #: the niceness of every component (and of the extra ones started on this plane)
        self.nice = nice
        self.pki = work_dir / "pki"
        self.log_dir = work_dir / "logs"
        self.kubeconfig = work_dir / "admin.kubeconfig"
        #: the API server's audit log (JSON lines) when `audit` is on
        self.audit_log: Path | None = work_dir / "audit.log" if audit else None
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self.started: list[Component] = []
        self.timings: dict[str, float] = {}
        self._ssl: ssl.SSLContext | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0

    def stop(self) -> None:
        t0 = time.monotonic()
        while self.started:
            self.started.pop().stop()
        atexit.unregister(self.stop)
        self.timings["stop"] = time.monotonic() - t0

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        t = time.monotonic()
        make_pki(self.pki)
        write_kubeconfig(self.kubeconfig, self.server, self.pki)
        self.timings["certificates"] = time.monotonic() - t
        steps: list[tuple[str, Callable[[], Component], Callable[[Component], None]]] = [
            (ETCD, self._etcd, self._wait_etcd),
            (APISERVER, self._apiserver, self._wait_apiserver),
            (CONTROLLER_MANAGER, self._controller_manager, self._wait_healthz(CONTROLLER_MANAGER)),
            (SCHEDULER, self._scheduler, self._wait_healthz(SCHEDULER)),
            (KWOK, self._kwok, self._wait_kwok),
        ]
        for name, make, wait in steps:
            if name not in self.wanted:
                continue
            t = time.monotonic()
            component = make()
            self.started.append(component)
            component.start()
            wait(component)
            self.timings[name] = time.monotonic() - t

    def _component(
        self, name: str, args: list[str], env: Mapping[str, str] | None = None
    ) -> Component:
        extra = list(self.extra_args.get(name, ()))
        override = {a.partition("=")[0] for a in extra}
        args = [a for a in args if a.partition("=")[0] not in override] + extra
        return Component(
            name, [str(self.binaries.path(name)), *args], self.log_dir / f"{name}.log", env,
            self.nice,
        )  # fmt: skip

    # -- components --------------------------------------------------------------------------------

    def _etcd(self) -> Component:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return self._component(
            ETCD,
            [
                "--name=e2e",
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=e2e={peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=2147483648",
                "--log-level=warn",
            ],
        )

    def _apiserver(self) -> Component:
        pki = self.pki
        return self._component(
            APISERVER,
            [
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                # Loopback advertise address + no endpoint reconciler: nothing needs the endpoints
                # of the `kubernetes` Service here, and a loopback address there is invalid.
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--cert-dir={self.work_dir / 'apiserver-certs'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                # ServiceAccount: no serviceaccount controller, so no `default` SA to admit pods.
                # TaintNodesByCondition: it puts not-ready:NoSchedule on every new node, and only
                # the node-lifecycle controller (not run here) would remove it.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--profiling=false",
                *self._audit_flags(),
            ],
        )

    def _audit_flags(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.work_dir / "audit-policy.yaml"
        policy.write_text(json.dumps(AUDIT_POLICY, indent=2))  # JSON is YAML
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # an event is written before the response returns
            "--audit-log-maxbackup=0",
        ]

    def _health_flags(self, port: int, name: str) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / name}",
            "--leader-elect=false",
        ]

    def _controller_manager(self) -> Component:
        return self._component(
            CONTROLLER_MANAGER,
            [
                *self._health_flags(self.ports.controller_manager, CONTROLLER_MANAGER),
                f"--controllers={','.join(KCM_CONTROLLERS)}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )

    def _scheduler(self) -> Component:
        config = self.work_dir / "kube-scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.kubeconfig),
                        "qps": 200,
                        "burst": 400,
                    },
                    "leaderElection": {"leaderElect": False},
                },
                indent=2,
            )
        )
        flags = self._health_flags(self.ports.scheduler, SCHEDULER)
        flags = [f for f in flags if not f.startswith(("--kubeconfig=", "--leader-elect="))]
        return self._component(SCHEDULER, [f"--config={config}", *flags])

    def _kwok(self) -> Component:
        home = self.work_dir / "kwok-home"  # kwok also reads ~/.kwok/kwok.yaml: keep it empty
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
        env["HOME"] = str(home)
        return self._component(
            KWOK,
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.binaries.kwok_stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.0.0.1",
                "--node-lease-duration-seconds=40",
            ],
            env,
        )

    # -- readiness ---------------------------------------------------------------------------------

    def _wait(self, component: Component, what: str, probe: Callable[[], str | None]) -> None:
        """Call ``probe`` until it returns None (ready) or the deadline; it returns why not."""
        deadline = time.monotonic() + self.timeout
        why = "no probe yet"
        delay = 0.05
        while True:
            code = component.exited()
            if code is not None:
                raise ControlPlaneError(
                    component.name, _explain_exit(component, code), component.log
                )
            try:
                result = probe()
            except ControlPlaneError:
                raise
            except Exception as exc:  # any probe failure just means "not yet"
                result = f"{type(exc).__name__}: {exc}"
            if result is None:
                return
            why = result
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    component.name,
                    f"not {what} after {self.timeout:.0f} s (last probe: {why})",
                    component.log,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _get(self, url: str, ctx: ssl.SSLContext | None, timeout: float = 1.0) -> tuple[int, str]:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
        )
        try:
            with opener.open(url, timeout=timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _wait_etcd(self, component: Component) -> None:
        url = f"http://127.0.0.1:{self.ports.etcd_client}/health"

        def probe() -> str | None:
            status, body = self._get(url, None)
            ok = status == 200 and json.loads(body).get("health") == "true"
            return None if ok else f"{status} {body.strip()[:200]}"

        self._wait(component, "healthy", probe)

    def _wait_apiserver(self, component: Component) -> None:
        def probe() -> str | None:
            status, body = self._get(f"{self.server}/readyz", self.ssl_context())
            if status != 200:
                return f"/readyz {status}: {body.strip()[-300:]}"
            # The apiserver's own controllers create the system namespaces just after readiness.
            status, body = self._get(f"{self.server}/api/v1/namespaces/default", self.ssl_context())
            return None if status == 200 else f"namespace default: {status}"

        self._wait(component, "ready", probe)

    def _wait_healthz(self, name: str) -> Callable[[Component], None]:
        port = self.ports.scheduler if name == SCHEDULER else self.ports.controller_manager
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed at start-up

        def wait(component: Component) -> None:
            def probe() -> str | None:
                status, body = self._get(f"https://127.0.0.1:{port}/healthz", insecure)
                return None if status == 200 else f"/healthz {status}: {body.strip()[-300:]}"

            self._wait(component, "healthy", probe)

        return wait

    def _wait_kwok(self, component: Component) -> None:
        """kwok has no health endpoint here: it must make a canary node Ready."""
        name = f"kwok-canary-{uuid.uuid4().hex[:8]}"
        canary = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
        }
        try:
            self.request("POST", "/api/v1/nodes", canary)
        except (OSError, ValueError) as exc:  # urllib's HTTPError/URLError are OSErrors
            raise ControlPlaneError(
                KWOK, f"could not create the canary node {name}: {exc}", component.log
            ) from exc

        def probe() -> str | None:
            node = self.request("GET", f"/api/v1/nodes/{name}")
            status = node.get("status")
            conditions = status.get("conditions") if isinstance(status, dict) else None
            for cond in conditions if isinstance(conditions, list) else []:
                if not isinstance(cond, dict):
                    continue
                if cond.get("type") == "Ready" and cond.get("status") == "True":
                    return None
            return f"canary node {name} not Ready yet"

        try:
            self._wait(component, "managing nodes", probe)
        finally:
            with contextlib.suppress(Exception):
                self.request("DELETE", f"/api/v1/nodes/{name}")

    # -- a tiny synchronous client (the tests use kubernetes_asyncio) -----------------------------

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
            self._ssl = ctx
        return self._ssl

    def request(self, method: str, path: str, body: Any = None) -> JsonObject:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.ssl_context())
        )
        with opener.open(req, timeout=10) as resp:
            return _json_object(resp.read(), f"{method} {path}")

    def describe(self) -> str:
        parts = [f"{k} {v:.1f}s" for k, v in self.timings.items()]
        return f"server {self.server}, logs {self.log_dir}; " + ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# A second kube-apiserver on the same etcd, and etcd compaction (for the watch tests)


class _ExtraComponent:
    """A further control-plane process a test starts and stops on its own (see ExtraApiserver and
    ExtraScheduler): launched, then waited for until `probe` reports it ready; stopped if it
    never is. Context manager."""

    plane: ControlPlane
    name: str
    argv: list[str]
    component: Component | None = None
    #: its niceness; None: the plane's
    nice: int | None = None

    @property
    def log(self) -> Path:
        return self.plane.log_dir / f"{self.name}.log"

    def start(self) -> None:
        raise NotImplementedError

    def _launch(self, what: str, probe: Callable[[], str | None]) -> None:
        nice = self.plane.nice if self.nice is None else self.nice
        component = Component(self.name, list(self.argv), self.log, nice=nice)
        self.component = component
        component.start()
        try:
            self.plane._wait(component, what, probe)
        except BaseException:
            component.stop()
            raise

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()
            self.component = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ExtraApiserver(_ExtraComponent):
    """Another kube-apiserver on the control plane's etcd: its own port, kubeconfig and extra
    flags (e.g. ``--watch-cache=false``). A test may stop and start it again on the same port to
    drop every connection to it, without disturbing the shared apiserver. Context manager.

    Start it from the main thread: the process gets SIGKILL when the thread that started it
    exits (``PR_SET_PDEATHSIG``), and worker threads (``anyio.to_thread``) come and go."""

    def __init__(self, plane: ControlPlane, name: str, extra_args: Sequence[str] = ()) -> None:
        self.plane = plane
        self.name = f"{APISERVER}-{name}"
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = plane.work_dir / f"{self.name}.kubeconfig"
        write_kubeconfig(self.kubeconfig, self.server, plane.pki)
        # no audit log of its own (the shared one belongs to the fixture's apiserver)
        base = [a for a in plane._apiserver().argv if not a.startswith("--audit-")]
        extra = [
            f"--secure-port={self.port}",
            f"--cert-dir={plane.work_dir / self.name}",
            *extra_args,
        ]
        override = {a.partition("=")[0] for a in extra}
        self.argv = [a for a in base if a.partition("=")[0] not in override] + extra

    def start(self) -> None:
        def probe() -> str | None:
            status, body = self.plane._get(f"{self.server}/readyz", self.plane.ssl_context())
            return None if status == 200 else f"/readyz {status}: {body.strip()[-300:]}"

        self._launch("ready", probe)

    def kill(self) -> None:
        """SIGKILL, as in a crash: every connection drops at once (a SIGTERM'd apiserver waits
        for its watches for the whole grace period)."""
        proc = self.component.process if self.component is not None else None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self.stop()


def _etcd_call(plane: ControlPlane, api: str, body: Mapping[str, Any]) -> JsonObject:
    """etcd's v3 JSON gateway (no etcdctl needed)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{plane.ports.etcd_client}/v3/{api}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=10) as resp:
        return _json_object(resp.read(), f"etcd {api}")


def _json_object(data: bytes, what: str) -> JsonObject:
    """An answer's body (empty: `{}`); `ValueError` when it is not a JSON object."""
    got = json.loads(data or b"{}")
    if not isinstance(got, dict):
        raise ValueError(f"{what}: the answer is not a JSON object")
    return got


def etcd_revision(plane: ControlPlane) -> int:
    """etcd's current revision (a resourceVersion, as the apiserver shows it)."""
    got = _etcd_call(plane, "kv/range", {"key": base64.b64encode(b"/pyctl-e2e-none").decode()})
    revision = as_object(got.get("header"), "etcd kv/range: header").get("revision")
    if not isinstance(revision, str | int):
        raise ValueError(f"etcd kv/range: header.revision is {revision!r}")
    return int(revision)


def etcd_compact(plane: ControlPlane, revision: int) -> None:
    """Compact etcd's history up to ``revision``: watches from older resourceVersions that reach
    etcd (an apiserver without a watch cache) then get 410 Gone."""
    _etcd_call(plane, "kv/compaction", {"revision": str(revision), "physical": True})


# --------------------------------------------------------------------------------------------------
# A second kube-scheduler with its own KubeSchedulerConfiguration (e.g. a profile with its own
# schedulerName and a scheduler extender)


class ExtraScheduler(_ExtraComponent):
    """Another kube-scheduler on the control plane: its own secure port and its own
    KubeSchedulerConfiguration (``config`` is merged over the client connection and leader
    election the fixture's scheduler uses). Pods name it by one of its profiles'
    ``schedulerName``. Context manager; start it from the main thread (see ExtraApiserver).
    ``nice``: its niceness (None: the plane's)."""

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        config: Mapping[str, Any],
        extra_args: Sequence[str] = (),
        nice: int | None = None,
    ) -> None:
        self.plane = plane
        self.nice = nice
        self.name = f"{SCHEDULER}-{name}"
        self.port = free_port()
        self.config_path = plane.work_dir / f"{self.name}.yaml"
        full: JsonObject = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(plane.kubeconfig), "qps": 200, "burst": 400},
            "leaderElection": {"leaderElect": False},
            **config,
        }
        self.config_path.write_text(json.dumps(full, indent=2))
        flags = plane._health_flags(self.port, self.name)
        flags = [f for f in flags if not f.startswith(("--kubeconfig=", "--leader-elect="))]
        extra = list(extra_args)
        override = {a.partition("=")[0] for a in extra}
        base = [f"--config={self.config_path}", *flags]
        self.argv = [
            str(plane.binaries.path(SCHEDULER)),
            *[a for a in base if a.partition("=")[0] not in override],
            *extra,
        ]

    def start(self) -> None:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its serving cert is self-signed at start-up

        def probe() -> str | None:
            status, body = self.plane._get(f"https://127.0.0.1:{self.port}/healthz", insecure)
            return None if status == 200 else f"/healthz {status}: {body.strip()[-300:]}"

        self._launch("healthy", probe)

    @property
    def pid(self) -> int | None:
        """Its process id while it runs."""
        proc = self.component.process if self.component is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None
