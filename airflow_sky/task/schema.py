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
STORE_TYPES = ("s3", "gcs", "r2", "azure", "ibm", "oci", "nebius", "coreweave", "volume")
BUCKET_URI_SCHEMES = ("s3", "gs", "r2", "https", "cos", "oci", "nebius", "cw")
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # SkyPilot's resources.priority range

# Fields airflow-sky parses and round-trips but does not act on yet; using one gives a SpecWarning.
INERT_TASK_FIELDS = (
    "service",
    "config",
    "experimental",
    "event_callback",
    "volumes",
    "inputs",
    "outputs",
)
# Top-level fields kept as written and read by their own rules (task.pool): acted on, so never inert.
ACTED_EXTRA_TASK_FIELDS = ("pool",)
# ports, labels, disk_tier and network_tier act (aws, gcp; ports also local, ssh); where one has no effect
# is said per infra (task/resources_effects.py).
INERT_RESOURCE_FIELDS = ("accelerator_args", "priority", "volumes")
INERT_STORAGE_FIELDS = ("config",)

# SkyPilot-internal fields: its schemas accept them in YAML it writes for itself (controllers, saved
# clusters), but they are not part of a task a user writes; refused with that reason.
INTERNAL_TASK_FIELDS = ("file_mounts_mapping", "volume_mounts", "_metadata")
INTERNAL_RESOURCE_FIELDS = (
    "_no_missing_accel_warnings",
    "_docker_login_config",
    "_docker_username_for_runpod",
    "_is_image_managed",
    "_requires_fuse",
    "_cluster_config_overrides",
)
INTERNAL_STORAGE_FIELDS = ("_is_sky_managed", "_bucket_sub_path", "_force_delete")

_STRING: dict[str, Any] = {"type": "string", "description": "a string"}
_BOOLEAN: dict[str, Any] = {"type": "boolean", "description": "true or false"}
_DISK_SIZE: dict[str, Any] = {
    "anyOf": [
        {"type": "integer", "minimum": 1, "description": "a positive integer (GB)"},
        {"type": "string"},
    ],
    "description": "a positive integer (GB) or a size with a unit, e.g. '1024GB' or '1TB'",
}
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
            "type": ["string", "number", "boolean", "null"],
            "description": "a string, a number or a boolean (null only if the value is given at launch "
            "with --env/--env-file)",
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

_PORT_ITEM: dict[str, Any] = {
    "type": ["integer", "string"],
    "description": "a port 1..65535 or a range 'LO-HI'",
}

_ACCELERATORS: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "object", "additionalProperties": {"type": ["number", "null"]}},
        {"type": "array", "items": {"type": "string"}},
    ],
    "description": "'NAME[:COUNT]', a mapping {NAME: COUNT} or a list of 'NAME[:COUNT]' candidates",
}

_RESOURCE_VOLUME: dict[str, Any] = {
    "type": "object",
    "description": "a volume mapping {path, name, disk_size, disk_tier, storage_type, attach_mode, auto_delete}",
    "properties": {
        "disk_size": _DISK_SIZE,
        "disk_tier": _STRING,
        "path": _STRING,
        "auto_delete": _BOOLEAN,
        "storage_type": _STRING,
        "name": _STRING,
        "attach_mode": _STRING,
    },
}

_AUTOSTOP: dict[str, Any] = {
    "anyOf": [
        {"type": ["boolean", "integer", "string"]},
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "idle_minutes": {"type": ["integer", "string"], "description": "minutes or a duration"},
                "down": _BOOLEAN,
                "wait_for": _STRING,
                "hook": _STRING,
                "hook_timeout": {"type": "integer", "minimum": 1, "description": "an integer >= 1 (seconds)"},
            },
        },
    ],
    "description": "a boolean, minutes, a duration string or a mapping "
    "{idle_minutes, down, wait_for, hook, hook_timeout}",
}

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
    "accelerators": _ACCELERATORS,
    "gpus": _ACCELERATORS,  # SkyPilot's alias of accelerators
    "instance_type": _STRING,
    "use_spot": _BOOLEAN,
    "disk_size": _DISK_SIZE,
    "job_recovery": _JOB_RECOVERY,
    "spot_recovery": _JOB_RECOVERY,  # SkyPilot's legacy name of job_recovery
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
    "autostop": _AUTOSTOP,
    # Parsed but not acted on yet (INERT_RESOURCE_FIELDS).
    "accelerator_args": {
        "type": "object",
        "additionalProperties": False,
        "description": "a mapping {runtime_version, tpu_name, tpu_vm, gcp_queued_resource}",
        "properties": {
            "runtime_version": _STRING,
            "tpu_name": _STRING,
            "tpu_vm": _BOOLEAN,
            "gcp_queued_resource": _BOOLEAN,
        },
    },
    "priority": {
        "type": "integer",
        "minimum": MIN_PRIORITY,
        "maximum": MAX_PRIORITY,
        "description": f"an integer {MIN_PRIORITY}..{MAX_PRIORITY}",
    },
    "volumes": {"type": "array", "items": _RESOURCE_VOLUME, "description": "a list of volume mappings"},
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
        "persistent": _BOOLEAN,
        "config": {
            "type": "object",
            "description": "a mapping {disk_size, disk_tier, storage_type, attach_mode}",
            "properties": {
                "disk_size": _DISK_SIZE,
                "disk_tier": _STRING,
                "storage_type": _STRING,
                "attach_mode": _STRING,
            },
        },
    },
}

# inputs/outputs (SkyPilot: experimental): {URI: estimated size in GB}, one entry.
_IO_ESTIMATE: dict[str, Any] = {
    "type": "object",
    "maxProperties": 1,
    "additionalProperties": {"type": "number", "description": "an estimated size in GB (a number)"},
    "description": "a mapping of one URI to its estimated size in GB",
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
            # A storage mapping is checked against STORAGE_SCHEMA after $VAR substitution, as in SkyPilot
            # (`store: $STORE` is allowed).
            "additionalProperties": {
                "type": ["string", "object"],
                "description": "a local path, a bucket URI (s3://, gs://, r2://...) or a storage mapping",
            },
        },
        "setup": _SCRIPT,
        "run": _SCRIPT,
        "pool": _MAPPING,  # task.pool checks it
        # Parsed but not acted on yet (INERT_TASK_FIELDS).
        "service": _MAPPING,
        "config": _MAPPING,
        "experimental": _MAPPING,
        "event_callback": _STRING,
        "volumes": {"type": ["object", "array"], "description": "a mapping or a list"},
        "inputs": _IO_ESTIMATE,
        "outputs": _IO_ESTIMATE,
    },
}
