"""Structure validation with `jsonschema`; its errors become one-line SpecErrors with dotted field paths."""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_sky.task.diagnostics import PathPart, SpecContext, show, unknown_field_message

if TYPE_CHECKING:  # jsonschema is imported on the first validation: `airflow-sky status` needs none
    from jsonschema.exceptions import ValidationError

_TYPE_PHRASES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


@functools.cache
def _strict_validator() -> Any:
    """JSON Schema counts 2.0 as an integer; a task field that wants an int should get an int."""
    import jsonschema

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
            "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
        ),
    )


# Schemas are module-level constants: compile each once, keyed by identity.
_VALIDATORS: dict[int, Any] = {}


def _validator(schema: dict[str, Any]) -> Any:
    compiled = _VALIDATORS.get(id(schema))
    if compiled is None:
        compiled = _VALIDATORS[id(schema)] = _strict_validator()(schema)
    return compiled


def _check_keys(instance: Any, ctx: SpecContext, path: list[PathPart]) -> None:
    """Mapping keys must be strings (YAML reads `123:` or `null:` as other types); say so before the schema
    looks at them."""
    if isinstance(instance, dict):
        for key, value in instance.items():
            if not isinstance(key, str):
                raise ctx.error(
                    [*path, show(key) if key is None else str(key)],
                    f"keys must be strings, got {show(key)}; quote the key",
                )
            _check_keys(value, ctx, [*path, key])
    elif isinstance(instance, list):
        for i, item in enumerate(instance):
            _check_keys(item, ctx, [*path, i])


def validate(
    instance: Any, schema: dict[str, Any], ctx: SpecContext, prefix: Sequence[PathPart] = ()
) -> None:
    """Raise the SpecError for the first (in document order) schema violation of `instance`, if any."""
    _check_keys(instance, ctx, list(prefix))
    validator = _validator(schema)
    errors = list(validator.iter_errors(instance))
    if errors:
        first = min(errors, key=lambda e: _doc_order(instance, _error_path(e)))
        path, message = _explain(first)
        raise ctx.error([*prefix, *path], message)


def _unknown_keys(error: ValidationError) -> list[Any]:
    schema = error.schema if isinstance(error.schema, dict) else {}
    instance: Any = error.instance
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [
        key
        for key in instance
        if key not in known and not (isinstance(key, str) and any(re.search(p, key) for p in patterns))
    ]


def _error_path(error: ValidationError) -> list[PathPart]:
    """The instance path an error is about; for unknown keys, the first unknown key itself."""
    path: list[PathPart] = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        extra = _unknown_keys(error)
        if extra:
            path.append(extra[0])
    elif error.validator == "required":
        required: Any = error.validator_value
        instance: Any = error.instance
        missing = [k for k in required if k not in instance]
        path.extend(missing[:1])
    return path


def _doc_order(instance: Any, path: Sequence[PathPart]) -> list[int]:
    """Sort key placing an error where its field appears in the document."""
    order: list[int] = []
    node = instance
    for part in path:
        if isinstance(node, dict) and part in node:
            order.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            order.append(part)
            node = node[part]
        else:
            order.append(1 << 30)
            break
    return order


def _explain(error: ValidationError) -> tuple[list[PathPart], str]:
    """(field path, what is allowed) for one jsonschema error."""
    path = _error_path(error)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties":
        key = path[-1]
        patterns = list(schema.get("patternProperties", {}))
        if patterns:
            return path, f"invalid name {str(key)!r}; names must match {patterns[0]}"
        return path, unknown_field_message(key, schema.get("properties", {}))
    if error.validator == "required":
        return path, "required field is missing"
    if error.validator in ("anyOf", "oneOf"):
        deeper = _matching_branch_error(error)
        if deeper is not None:
            return _explain(deeper)
    description = schema.get("description")
    if description:
        return path, f"must be {description}, got {show(error.instance)}"
    return path, f"{_generic(error)}, got {show(error.instance)}"


def _matching_branch_error(error: ValidationError) -> ValidationError | None:
    """For anyOf/oneOf: a deeper error from a branch whose type fits the value, so the message is precise.

    A mapping given where "a string or a storage mapping" is allowed should be told which storage field is
    wrong, not that it is neither.
    """
    mismatched = {
        e.schema_path[0]
        for e in error.context or []
        if e.validator == "type" and not e.relative_path and e.schema_path
    }
    fitting = [e for e in error.context or [] if e.schema_path and e.schema_path[0] not in mismatched]
    if not fitting:
        return None
    return min(fitting, key=lambda e: _doc_order(error.instance, list(e.relative_path)))


def _generic(error: ValidationError) -> str:
    value: Any = error.validator_value
    if error.validator == "type":
        types = [value] if isinstance(value, str) else list(value)
        return "must be " + " or ".join(_TYPE_PHRASES.get(t, t) for t in types)
    if error.validator == "minimum":
        return f"must be >= {value}"
    if error.validator == "maximum":
        return f"must be <= {value}"
    if error.validator == "pattern":
        return f"must match {value}"
    if error.validator == "minItems":
        return f"must have at least {value} item(s)"
    if error.validator == "uniqueItems":
        return "must not repeat items"
    if error.validator == "enum":
        return "must be one of " + ", ".join(map(str, value))
    return error.message
