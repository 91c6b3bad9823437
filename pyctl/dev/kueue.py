"""Kueue's manager as a local process next to the control plane (docs/control-plane.md, "Kueue").

Kueue runs in a cluster as a Deployment behind a Service, its webhooks and CRD conversion reached
through that Service with certificates its cert rotator makes. Here it is one process on
127.0.0.1, and what the Service and the rotator's certificates do is done by hand:

- a CA of our own (RSA: the rotator reads the CA key as PKCS#1; valid 10 years with the SAN
  ``kueue-ca`` the rotator checks) and a serving certificate for ``127.0.0.1`` (and the Service
  name the rotator checks), put in the Secret the rotator manages and in the webhook server's
  cert dir, so the rotator finds them valid and keeps them;
- the CRDs from Kueue's module (``config/crd/bases``), those its kustomization gives a
  conversion webhook (the ``patches/webhook_in_*.yaml`` it applies; not ResourceFlavor's, which
  it leaves commented out: v1beta2 ResourceFlavors do not convert) with ``url:
  https://127.0.0.1:<port>/convert`` and our CA;
- the webhook configurations of its ``config/webhook/manifests.yaml``, only those of the pod
  integration and of Kueue's own kinds, each ``clientConfig`` a ``url`` on that port; the pod
  webhooks select only pods with the ``kueue.x-k8s.io/queue-name`` label (so a stopped Kueue
  never blocks other pods; Kueue ignores pods without it anyway).

The Configuration turns on the pod integration only, serves webhooks on 127.0.0.1, has no leader
election, no metrics listener and the visibility server off; Topology Aware Scheduling is on by
default in v0.17. `stop()` removes the webhook configurations (the CRDs and their objects stay).
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from pyctl.jsontypes import JsonObject, JsonValue, as_object

from .control_plane import Binaries, Component, ControlPlane, ControlPlaneError, free_port
from .control_plane import _ExtraComponent as ExtraComponent

KUEUE = "kueue"
NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
#: the names the cert rotator injects its CA into (`<service base>-<type>-webhook-configuration`)
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: webhook paths served with the pod integration on: the pod's and Kueue's own kinds'
_SERVED = ("--v1-pod", "-kueue-x-k8s-io-")


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(
            KUEUE, f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}"
        )


def make_kueue_pki(pki: Path) -> None:
    """ca.crt/ca.key (RSA, PKCS#1, SAN kueue-ca) and tls.crt/tls.key for 127.0.0.1."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-traditional", "-out", "ca.key", "2048", cwd=pki)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "3650",
        "-subj", "/O=kueue/CN=kueue-ca", "-addext", "subjectAltName=DNS:kueue-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,digitalSignature,keyEncipherment", cwd=pki,
    )  # fmt: skip
    (pki / "tls.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName=IP:127.0.0.1,DNS:{SERVICE}.{NAMESPACE}.svc\n"
    )
    _openssl("genrsa", "-traditional", "-out", "tls.key", "2048", cwd=pki)
    _openssl(
        "req", "-new", "-key", "tls.key", "-out", "tls.csr", "-subj",
        f"/CN={SERVICE}.{NAMESPACE}.svc", cwd=pki,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "365", "-out", "tls.crt", "-extfile", "tls.ext", cwd=pki,
    )  # fmt: skip


def _load_all(path: Path) -> list[JsonObject]:
    docs = yaml.safe_load_all(path.read_text())
    return [d for d in docs if isinstance(d, dict)]


def converted_plurals(kustomization: Path) -> set[str]:
    """The CRDs (by plural) Kueue's CRD kustomization gives a conversion webhook: the patches
    ``patches/webhook_in_<plural>.yaml`` it applies."""
    doc = yaml.safe_load(kustomization.read_text())
    out = set()
    for patch in (doc.get("patches") or []) if isinstance(doc, dict) else []:
        name = Path(str(patch.get("path", ""))).name if isinstance(patch, dict) else ""
        if name.startswith("webhook_in_") and name.endswith(".yaml"):
            out.add(name[len("webhook_in_") : -len(".yaml")])
    return out


class KueueManager(ExtraComponent):
    """Kueue's manager against `plane` (see the module's doc). Start it from the main thread."""

    def __init__(self, plane: ControlPlane, binaries: Binaries) -> None:
        if binaries.kueue is None or binaries.kueue_config is None:
            raise ControlPlaneError(KUEUE, "not built: run scripts/control-plane build")
        self.plane = plane
        self.name = KUEUE
        self.binary = binaries.kueue
        self.config = binaries.kueue_config
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.visibility_port = free_port()
        self.dir = plane.work_dir / KUEUE
        self.pki = self.dir / "pki"
        self.cert_dir = self.dir / "certs"
        self.url = f"https://127.0.0.1:{self.webhook_port}"
        self.argv = [
            str(self.binary),
            f"--config={self.dir / 'config.yaml'}",
            f"--kubeconfig={plane.kubeconfig}",
            f"--visibility-server-port={self.visibility_port}",
            "--zap-log-level=2",
        ]

    # -- set-up ------------------------------------------------------------------------------------

    def _ca_bundle(self) -> str:
        return base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()

    def _apply(self, path: str, obj: JsonObject) -> None:
        """Create `obj` at the collection `path`, or replace it when it exists."""
        meta = as_object(obj.get("metadata"), f"{path}: metadata")
        name = meta.get("name")
        try:
            self.plane.request("POST", path, obj)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                why = f"POST {path} {name}: {exc.code} {exc.read()[:500]!r}"
                raise ControlPlaneError(KUEUE, why) from None
            got = self.plane.request("GET", f"{path}/{name}")
            rv = as_object(got.get("metadata"), f"{path}/{name}: metadata").get("resourceVersion")
            replaced = {**obj, "metadata": {**meta, "resourceVersion": rv}}
            self.plane.request("PUT", f"{path}/{name}", replaced)

    def crds(self) -> list[JsonObject]:
        """Kueue's CRDs, those with a conversion webhook pointed at this process."""
        converted = converted_plurals(self.config / "crd" / "kustomization.yaml")
        out = []
        for f in sorted((self.config / "crd" / "bases").glob("*.yaml")):
            for crd in _load_all(f):
                spec: Any = crd.get("spec")
                if isinstance(spec, dict) and spec.get("names", {}).get("plural") in converted:
                    spec["conversion"] = {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {
                                "url": f"{self.url}/convert",
                                "caBundle": self._ca_bundle(),
                            },
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                out.append(crd)
        return out

    def webhook_configurations(self) -> list[JsonObject]:
        """The mutating and validating configurations of Kueue's manifests, only the webhooks it
        serves with the pod integration, each pointed at this process."""
        out: list[JsonObject] = []
        for doc in _load_all(self.config / "webhook" / "manifests.yaml"):
            kind = doc.get("kind")
            hooks: Any = doc.get("webhooks") or []
            kept: list[JsonValue] = []
            for h in hooks:
                path = h.get("clientConfig", {}).get("service", {}).get("path", "")
                if not any(s in path for s in _SERVED):
                    continue
                h["clientConfig"] = {"url": f"{self.url}{path}", "caBundle": self._ca_bundle()}
                if path.endswith("--v1-pod"):
                    h["objectSelector"] = {
                        "matchExpressions": [{"key": QUEUE_LABEL, "operator": "Exists"}]
                    }
                h["timeoutSeconds"] = 10
                kept.append(h)
            name = MUTATING if kind == "MutatingWebhookConfiguration" else VALIDATING
            out.append({**doc, "metadata": {"name": name}, "webhooks": kept})
        return out

    def configuration(self) -> JsonObject:
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.cert_dir),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": SERVICE,
                "webhookSecretName": SECRET,
            },
            "clientConnection": {"qps": 100, "burst": 200},
            "integrations": {"frameworks": ["pod"]},
            "featureGates": {"VisibilityOnDemand": False},
        }

    def prepare(self) -> None:
        """Certificates, CRDs (Established), namespace, Secret, webhook configurations, config."""
        make_kueue_pki(self.pki)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for f in ("tls.crt", "tls.key"):
            (self.cert_dir / f).write_bytes((self.pki / f).read_bytes())
        crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        crds = self.crds()
        for crd in crds:
            self._apply(crd_path, crd)
        ns: JsonObject = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        self._apply("/api/v1/namespaces", ns)

        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()

        secret: JsonObject = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": {k: b64(k) for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")},
        }
        self._apply(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)
        base = "/apis/admissionregistration.k8s.io/v1"
        for wh in self.webhook_configurations():
            plural = (
                "mutatingwebhookconfigurations"
                if wh.get("kind") == "MutatingWebhookConfiguration"
                else "validatingwebhookconfigurations"
            )
            self._apply(f"{base}/{plural}", wh)
        (self.dir / "config.yaml").write_text(json.dumps(self.configuration(), indent=2))
        names = [as_object(c.get("metadata"), "CRD metadata").get("name") for c in crds]

        def established() -> str | None:
            for n in names:
                got = self.plane.request("GET", f"{crd_path}/{n}")
                status: Any = got.get("status") or {}
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in status.get("conditions") or []
                ):
                    return f"CRD {n} not Established"
            return None

        waiter = Component("kueue-crds", ["true"], self.dir / "crds.log")
        self.plane._wait(waiter, "Established", established)

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.prepare()
        ready = f"http://127.0.0.1:{self.health_port}/readyz"

        def probe() -> str | None:
            status, body = self.plane._get(ready, None)
            return None if status == 200 else f"/readyz {status}: {body.strip()[-300:]}"

        self._launch("ready", probe)

    def stop(self) -> None:
        base = "/apis/admissionregistration.k8s.io/v1"
        for plural, name in (
            ("mutatingwebhookconfigurations", MUTATING),
            ("validatingwebhookconfigurations", VALIDATING),
        ):
            with contextlib.suppress(OSError, ValueError):
                self.plane.request("DELETE", f"{base}/{plural}/{name}")
        super().stop()
