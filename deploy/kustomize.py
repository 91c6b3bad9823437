"""A minimal kustomize renderer, for where neither `kubectl kustomize` nor `kustomize` is at hand
(Debian's kubectl is 1.20 here, and no maintained kustomize is on PyPI). It supports exactly the
features deploy/ uses, and refuses any other field rather than render something else:

  resources      files and directories (with a kustomization.yaml), in order
  namespace      sets metadata.namespace on namespaced objects, renames the Namespace object,
                 and re-points ServiceAccount subjects of (Cluster)RoleBindings
  labels         pairs added to metadata.labels (includeSelectors/includeTemplates false only)
  patches        strategic-merge patches, inline (patch) or from a file (path), with an optional
                 target (kind, name): maps merge, lists of named items merge by name, other
                 lists are replaced

    python deploy/kustomize.py deploy/overlays/observe > observe.yaml
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
    "StorageClass",
}
SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "patches"}


class KustomizeError(ValueError):
    pass


def _load_all(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d:
            raise KustomizeError(f"{path}: not a Kubernetes object: {str(d)[:80]}")
    return docs


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        out_list = [copy.deepcopy(x) for x in base]
        index = {x["name"]: i for i, x in enumerate(out_list)}
        for item in patch:
            if item["name"] in index:
                i = index[item["name"]]
                out_list[i] = _merge(out_list[i], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _matches(obj: dict[str, Any], target: dict[str, Any]) -> bool:
    unknown = set(target) - {"kind", "name"}
    if unknown:
        raise KustomizeError(f"patch target fields not supported: {sorted(unknown)}")
    meta = obj.get("metadata", {})
    return all(
        (k != "kind" or obj.get("kind") == v) and (k != "name" or meta.get("name") == v)
        for k, v in target.items()
    )


def build(directory: str | Path, namespace: str | None = None) -> list[dict[str, Any]]:
    """Render the kustomization in `directory`; `namespace` overrides its namespace field
    (as `kustomize edit set namespace` would)."""
    d = Path(directory)
    kpath = d / KUSTOMIZATION
    if not kpath.exists():
        raise KustomizeError(f"{d}: no {KUSTOMIZATION}")
    k = yaml.safe_load(kpath.read_text(encoding="utf-8")) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{kpath}: fields not supported by this renderer: {sorted(unknown)}")
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        p = (d / res).resolve()
        objs += build(p) if p.is_dir() else _load_all(p)
    for patch in k.get("patches", []):
        if "patch" in patch:
            body = yaml.safe_load(patch["patch"])
        elif "path" in patch:
            body = yaml.safe_load((d / patch["path"]).read_text(encoding="utf-8"))
        else:
            raise KustomizeError(f"{kpath}: a patch needs patch or path")
        target = patch.get("target") or {
            "kind": body["kind"],
            "name": body["metadata"]["name"],
        }
        hit = [i for i, o in enumerate(objs) if _matches(o, target)]
        if not hit:
            raise KustomizeError(f"{kpath}: patch target {target} matches nothing")
        for i in hit:
            body_i = {kk: vv for kk, vv in body.items() if kk not in ("apiVersion", "kind")}
            body_i.get("metadata", {}).pop("name", None)
            objs[i] = _merge(objs[i], body_i)
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise KustomizeError(f"{kpath}: labels with selectors/templates not supported")
        for o in objs:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    ns = namespace or k.get("namespace")
    if ns:
        for o in objs:
            meta = o.setdefault("metadata", {})
            if o["kind"] == "Namespace":
                meta["name"] = ns
            elif o["kind"] not in CLUSTER_SCOPED:
                meta["namespace"] = ns
            if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
                for s in o.get("subjects", []):
                    if s.get("kind") == "ServiceAccount":
                        s["namespace"] = ns
    return objs


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python deploy/kustomize.py DIRECTORY", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(build(argv[0]), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
