"""JSON Schemas for task YAML, after SkyPilot's `sky/utils/schemas.py`: structure only, unknown keys rejected.

A schema node's `description` is the "what is allowed" part of the error message for a value it rejects.
Rules a schema cannot express (accelerator strings, infra, cpus/memory forms, ports) are checked in code.
"""

from __future__ import annotations

from typing import Any

NAME_PATTERN = r"^[a-zA-Z0-9]+(?:[._-]{1,2}[a-zA-Z0-9]+)*$"
ENV_KEY_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"

SUPPORTED_CLOUDS = ("local", "ssh", "aws", "gcp")
JOB_RECOVERY_STRATEGIES = ("FAILOVER", "EAGER_NEXT_REGION")
STORAGE_MODES = ("MOUNT", "COPY", "MOUNT_CACHED")
STORE_TYPES = ("s3", "gcs", "r2", "azure", "ibm", "oci", "nebius")
BUCKET_URI_SCHEMES = ("s3", "gs", "r2", "https", "cos", "oci", "nebius")

# Fields airflow-sky parses and round-trips but does not act on yet; using one gives a SpecWarning.
INERT_TASK_FIELDS = ("service", "pool", "config", "experimental", "event_callback", "volumes")
INERT_RESOURCE_FIELDS = (
    "ports",
    "labels",
    "disk_tier",
    "network_tier",
    "accelerator_args",
)

_STRING: dict[str, Any] = {"type": "string", "description": "a string"}
_MAPPING: dict[str, Any] = {"type": "object", "description": "a mapping"}
_EXIT_CODE: dict[str, Any] = {
    "type": "integer",
    "minimum": 0,
    "maximum": 255,
    "description": "an exit code (integer 0..255)",
}

_ENV_MAP: dict[str, Any] = {
    "type": "object",
    "description": "a mapping of NAME: value",
    "patternProperties": {
        ENV_KEY_PATTERN: {
            "type": ["string", "number", "null"],
            "description": "a string or a number (quote booleans: 'true'; null only if the value is "
            "given at launch with --env/--env-file)",
        }
    },
    "additionalProperties": False,
}

_SCRIPT: dict[str, Any] = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
    "description": "a shell script string or a list of strings (joined with newlines)",
}

_JOB_RECOVERY: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "strategy": {"type": ["string", "null"], "description": "a strategy name or null"},
                "max_restarts_on_errors": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "an integer >= 0",
                },
                "recover_on_exit_codes": {
                    "anyOf": [_EXIT_CODE, {"type": "array", "items": _EXIT_CODE, "uniqueItems": True}],
                    "description": "an exit code (0..255) or a list of distinct exit codes",
                },
            },
        },
    ],
    "description": "a strategy name or a mapping {strategy, max_restarts_on_errors, recover_on_exit_codes}",
}

_PORT_ITEM: dict[str, Any] = {"type": ["integer", "string"]}

_SINGLE_RESOURCE_PROPERTIES: dict[str, Any] = {
    "infra": {**_STRING, "description": "'cloud[/region[/zone]]', e.g. 'aws/us-east-1'"},
    "cloud": {**_STRING, "description": f"a cloud name, one of {', '.join(SUPPORTED_CLOUDS)}"},
    "region": _STRING,
    "zone": _STRING,
    "cpus": {
        "type": ["string", "number"],
        "description": "a number of CPUs: N or 'N+' (at least N), e.g. 4 or '4+'",
    },
    "memory": {
        "type": ["string", "number"],
        "description": "memory in GB: N, 'N+' (at least N) or 'NGB', e.g. 32, '64+' or '32GB'",
    },
    "accelerators": {
        "anyOf": [
            {"type": "string"},
            {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
            {"type": "array", "items": {"type": "string"}},
        ],
        "description": "'NAME[:COUNT]', a mapping {NAME: COUNT} or a list of 'NAME[:COUNT]' candidates",
    },
    "instance_type": _STRING,
    "use_spot": {"type": "boolean", "description": "true or false"},
    "disk_size": {"type": "integer", "minimum": 1, "description": "a positive integer (GB)"},
    "job_recovery": _JOB_RECOVERY,
    # Parsed but not acted on yet (INERT_RESOURCE_FIELDS).
    "ports": {
        "anyOf": [_PORT_ITEM, {"type": "array", "items": _PORT_ITEM}],
        "description": "a port (8080), a range ('10000-10010') or a list of them",
    },
    "image_id": {"type": ["string", "object"], "description": "an image id string or a mapping"},
    "labels": {
        "type": "object",
        "additionalProperties": {"type": "string", "description": "a string (quote numbers)"},
        "description": "a mapping of string keys to string values",
    },
    "disk_tier": _STRING,
    "network_tier": _STRING,
    "autostop": {
        "type": ["boolean", "integer", "string", "object"],
        "description": "a boolean, minutes, a duration string or a mapping",
    },
    "accelerator_args": _MAPPING,
}

SINGLE_RESOURCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "a mapping of resource fields",
    "additionalProperties": False,
    "properties": _SINGLE_RESOURCE_PROPERTIES,
}

RESOURCES_SCHEMA: dict[str, Any] = {
    **SINGLE_RESOURCES_SCHEMA,
    "properties": {
        **_SINGLE_RESOURCE_PROPERTIES,
        "any_of": {
            "type": "array",
            "minItems": 1,
            "items": SINGLE_RESOURCES_SCHEMA,
            "description": "a non-empty list of resource mappings",
        },
        "ordered": {
            "type": "array",
            "minItems": 1,
            "items": SINGLE_RESOURCES_SCHEMA,
            "description": "a non-empty list of resource mappings",
        },
    },
}

STORAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "a storage mapping {name, source, store, mode, persistent}",
    "additionalProperties": False,
    "properties": {
        "name": _STRING,
        "source": {
            "anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}],
            "description": "a local path or bucket URI, or a non-empty list of local paths",
        },
        "store": {
            "type": "string",
            "pattern": f"(?i)^(?:{'|'.join(STORE_TYPES)})$",
            "description": f"one of {', '.join(STORE_TYPES)}",
        },
        "mode": {
            "type": "string",
            "pattern": f"(?i)^(?:{'|'.join(STORAGE_MODES)})$",
            "description": f"one of {', '.join(STORAGE_MODES)}",
        },
        "persistent": {"type": "boolean", "description": "true or false"},
    },
}

TASK_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "description": "a mapping of task fields",
    "additionalProperties": False,
    "properties": {
        "name": {
            "type": "string",
            "pattern": NAME_PATTERN,
            "description": "letters/digits joined by '.', '_' or '-' (one or two), e.g. 'minGPT-ddp'",
        },
        "workdir": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "required": ["url"],
                    "additionalProperties": False,
                    "properties": {"url": _STRING, "ref": _STRING},
                },
            ],
            "description": "a local directory or a git mapping {url, ref}",
        },
        "num_nodes": {"type": "integer", "minimum": 1, "description": "an integer >= 1"},
        # Validated against RESOURCES_SCHEMA by Resources itself, so Python construction gets the same checks.
        "resources": {"type": "object", "description": "a mapping of resource fields"},
        "envs": _ENV_MAP,
        "secrets": _ENV_MAP,
        "file_mounts": {
            "type": "object",
            "description": "a mapping of remote path: source",
            "additionalProperties": {
                "anyOf": [{"type": "string"}, STORAGE_SCHEMA],
                "description": "a local path, a bucket URI (s3://, gs://, r2://...) or a storage mapping",
            },
        },
        "setup": _SCRIPT,
        "run": _SCRIPT,
        # Parsed but not acted on yet (INERT_TASK_FIELDS).
        "service": _MAPPING,
        "pool": _MAPPING,
        "config": _MAPPING,
        "experimental": _MAPPING,
        "event_callback": _STRING,
        "volumes": {"type": ["object", "array"], "description": "a mapping or a list"},
    },
}
