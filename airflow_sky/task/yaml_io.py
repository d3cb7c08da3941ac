"""YAML in (safe loading; syntax errors as SpecErrors naming file and line) and out (scripts as blocks)."""

from __future__ import annotations

from typing import Any

import yaml

from airflow_sky.errors import SpecError
from airflow_sky.task.diagnostics import one_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` keys may be overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, str | int | float | bool) and key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml_documents(text: str, source: str) -> list[Any]:
    """Parse every YAML document of `text` safely; empty documents (a trailing `---`) are dropped.

    Errors name `source` and the line.
    """
    try:
        documents = list(yaml.load_all(text, Loader=_UniqueKeyLoader))  # a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(one_line(f"{source}: {where}invalid YAML: {problem}")) from e
    return [document for document in documents if document is not None]


def parse_yaml(text: str, source: str) -> Any:
    """Parse a one-document YAML (one task) safely; an empty document is {}. Errors name `source` and line."""
    documents = parse_yaml_documents(text, source)
    if len(documents) > 1:
        raise SpecError(
            f"{source}: found {len(documents)} YAML documents ('---'): that is a pipeline, not one task; "
            "load it with airflow_sky.load_pipeline() or sky_pipeline(), or run it with `airflow-sky launch`"
        )
    return documents[0] if documents else {}


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (setup/run scripts) as `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    """YAML text for plain data, keys in the given order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
