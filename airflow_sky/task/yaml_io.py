"""YAML in (safe loading; syntax errors as SpecErrors naming file and line) and out (scripts as blocks).

Reading is bounded, so that a small hostile file cannot stall `check` or a DAG processor: a file nests
lists and mappings at most MAX_YAML_DEPTH deep and holds at most MAX_YAML_NODES values, both counted with
every alias (`*name`) expanded, as the code that reads the task later sees it ("billion laughs": a few
hundred bytes of nested aliases expand to billions of values), in at most MAX_YAML_DOCUMENTS documents.
A mapping key is one value, never a list or a mapping. The limits are documented in
docs/yaml-reference.md ("Limits").
"""

from __future__ import annotations

from typing import Any, cast

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from airflow_sky.errors import SpecError
from airflow_sky.task.diagnostics import PathPart, format_path, one_line, show

MAX_YAML_DEPTH = 64  # lists/mappings inside each other
MAX_YAML_NODES = 10_000  # scalars, lists and mappings in one file (all its documents)
MAX_YAML_DOCUMENTS = 100  # a pipeline file's header and tasks


class _Refused(yaml.MarkedYAMLError):
    """Well-formed YAML this loader will not build (over a limit, a list as a key): the message names the
    field and the rule, not "invalid YAML"."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that measures each node as it is composed, before anything constructs or expands it.

    Running count: every position in the file adds 1, or, for an alias, the size of what it names;
    so the count is the document's size with aliases expanded, and it is checked at every step. Also
    refuses a key given twice in one mapping (PyYAML silently keeps the last) and a list/mapping as a key.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[PathPart] = []  # the field being composed, for messages
        self._depth = 0  # lists/mappings open around the current position
        self._expanded = 0  # values so far in this file, aliases expanded
        self._documents = 0
        self._measured: dict[int, tuple[Node, int, int]] = {}  # id -> (node, size, depth), aliases expanded

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        """`[`/`{` past the depth limit, refused while scanning: PyYAML's scanner reads a run of them all
        before the first reaches the composer, at a cost that grows with the square of their number."""
        if self.flow_level >= MAX_YAML_DEPTH:
            raise self._refuse(f"nested more than {MAX_YAML_DEPTH} lists/mappings deep", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_document(self) -> Node | None:
        self._documents += 1
        if self._documents > MAX_YAML_DOCUMENTS:
            raise _Refused(
                None,
                None,
                f"more than {MAX_YAML_DOCUMENTS} YAML documents ('---'); a pipeline file holds at most "
                f"{MAX_YAML_DOCUMENTS} (its header and its tasks)",
                self.peek_event().start_mark,
            )
        self._measured = {}  # anchors (and what aliases name) are per document
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            return self._compose_alias(parent, index)
        is_key = isinstance(parent, MappingNode) and index is None
        if not is_key and parent is not None:
            self._path.append(index.value if isinstance(index, ScalarNode) else index)
        start = self._expanded
        self._count(1, self.peek_event().start_mark)
        opens = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        if opens:
            self._depth += 1
            if self._depth > MAX_YAML_DEPTH:
                raise self._refuse(f"nested more than {MAX_YAML_DEPTH} lists/mappings deep")
        node = cast(Node, super().compose_node(parent, index))  # a node's event was peeked above
        if opens:
            self._depth -= 1
        if is_key and not isinstance(node, ScalarNode):
            kind = "a list" if isinstance(node, SequenceNode) else "a mapping"
            raise self._refuse(f"a mapping key must be a single value (a name), got {kind}", node.start_mark)
        self._measured[id(node)] = (node, self._expanded - start, self._depth_of(node))
        if not is_key and parent is not None:
            self._path.pop()
        return node

    def _compose_alias(self, parent: Node | None, index: Any) -> Node:
        mark = self.peek_event().start_mark
        node: Node | None = super().compose_node(parent, index)
        measured = self._measured.get(id(node))
        if node is None or measured is None:  # its anchor is still open: the value would contain itself
            raise self._refuse("an alias (*name) names a list or mapping that contains it", mark)
        _, size, depth = measured
        self._count(size, mark)
        if self._depth + depth > MAX_YAML_DEPTH:
            raise self._refuse(
                f"nested more than {MAX_YAML_DEPTH} lists/mappings deep once its aliases (*name) are expanded",
                mark,
            )
        if isinstance(parent, MappingNode) and index is None and not isinstance(node, ScalarNode):
            raise self._refuse(
                "a mapping key must be a single value (a name), got an alias of a list/mapping", mark
            )
        return node

    def _count(self, size: int, mark: Any) -> None:
        self._expanded += size
        if self._expanded > MAX_YAML_NODES:
            raise self._refuse(
                f"the file holds more than {MAX_YAML_NODES} values (lists, mappings and scalars, with "
                "aliases (*name) expanded)",
                mark,
            )

    def _depth_of(self, node: Node) -> int:
        """Lists/mappings inside each other in `node`, aliases expanded (a scalar is 0)."""
        if isinstance(node, SequenceNode):
            children: list[Node] = node.value
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            return 0
        return 1 + max((self._measured[id(child)][2] for child in children), default=0)

    def _refuse(self, problem: str, mark: Any = None) -> _Refused:
        path = self._path
        where = (
            format_path(path)
            if len(path) <= 8
            else f"{format_path(path[:4])}...{path[-1]} ({len(path)} levels)"
        )
        return _Refused(None, None, f"{where}: {problem}", mark or self.peek_event().start_mark)

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """A value PyYAML cannot build (`2024-13-45` as a date, an int of 5,000 digits, `!!int` with no
        digits, `!!bool maybe`) is one error at its line, not an exception from inside the constructor."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError) as e:
            shown = show(node.value) if isinstance(node, ScalarNode) else "this value"
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            # A ValueError says why (month must be in 1..12); not Python's advice (sys.set_int_max_str_digits).
            reason = f": {str(e).split(';')[0]}" if isinstance(e, ValueError | OverflowError) else ""
            raise _Refused(None, None, f"cannot read {shown} as {tag}{reason}", node.start_mark) from e


def _construct_mapping(loader: _BoundedLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` keys may be overridden on purpose
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str | int | float | bool):
            continue  # a date or null key: the schema says keys must be strings
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_BoundedLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml_documents(text: str, source: str) -> list[Any]:
    """Parse every YAML document of `text` safely and within the limits above; empty documents (a
    trailing `---`) are dropped. Errors name `source`, the line and, for a limit, the field."""
    loader = None
    try:
        loader = _BoundedLoader(text)  # (its reader refuses control characters here already)
        documents = []
        while loader.check_data():
            documents.append(loader.get_data())
    except _Refused as e:
        raise SpecError(one_line(f"{source}: {_where(e)}{e.problem}")) from None
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(one_line(f"{source}: {_where(e)}invalid YAML: {problem}")) from e
    finally:
        if loader is not None:
            loader.dispose()
    return [document for document in documents if document is not None]


def _where(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


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
