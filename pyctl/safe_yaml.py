"""YAML from users, read one way: the configuration file (`app/config.py`), the kubeconfig
(`cluster/kube/client.py`, before the Kubernetes client reads it) and mig-parted configs
(`core/mig.py`, from a ConfigMap anyone with its RBAC may write).

YAML's aliases let a few hundred bytes stand for a billion values (anchors nested nine deep,
each repeated nine times: PyYAML builds it shared, in no time, but anything that walks it, a
message's `repr` included, walks all of it). The inputs read here never need them, so an alias
is refused, as is a key given twice in one mapping (YAML's loaders keep the last one, silently)
and a merge key (`<<`, whose keys the mapping's own override, silently too).
Every refusal is one `YamlInputError` naming the input and the line.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlInputError(ValueError):
    """YAML that pyctl does not read; the message names the input and, where known, the line."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases and without duplicate keys."""

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise YamlInputError(
                f"line {event.start_mark.line + 1}: YAML aliases (*{event.anchor}) are not accepted"
            )
        node: Node | None = super().compose_node(parent, index)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # a mapping merged in, its keys overridden
                raise YamlInputError(
                    f"line {key_node.start_mark.line + 1}: YAML merge keys (<<) are not accepted"
                )
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: PyYAML's own message below
                continue
            if duplicate:
                raise YamlInputError(
                    f"line {key_node.start_mark.line + 1}: key {str(key)[:100]!r} given twice"
                )
            seen.add(key)
        out: dict[Any, Any] = super().construct_mapping(node, deep)
        return out


def load(text: str, where: str) -> Any:
    """The one YAML document in `text` (JSON included); `YamlInputError` naming `where`."""
    try:
        loader = _Loader(text)  # the reader refuses control characters here
    except yaml.YAMLError as e:
        raise YamlInputError(f"{where}: not valid YAML: {str(e).splitlines()[0]}") from None
    try:
        return loader.get_single_data()
    except YamlInputError as e:
        raise YamlInputError(f"{where}: {e}") from None
    except (yaml.YAMLError, ConstructorError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise YamlInputError(f"{where}: not valid YAML: {first}") from None
    except RecursionError:
        raise YamlInputError(f"{where}: nested too deeply") from None
    finally:
        loader.dispose()
