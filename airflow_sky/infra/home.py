"""Where airflow-sky keeps client-side files: `~/.airflow_sky` (or $AIRFLOW_SKY_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "AIRFLOW_SKY_HOME"


def sky_home() -> Path:
    configured = os.environ.get(HOME_ENV)
    return Path(configured) if configured else Path.home() / ".airflow_sky"


SSH_CONFIG_ENV = "AIRFLOW_SKY_SSH_CONFIG"  # the user's OpenSSH client config (default ~/.ssh/config)
KNOWN_HOSTS_ENV = "AIRFLOW_SKY_KNOWN_HOSTS"  # the user's known_hosts (default ~/.ssh/known_hosts)


def user_ssh_config() -> Path:
    configured = os.environ.get(SSH_CONFIG_ENV)
    return Path(configured) if configured else Path.home() / ".ssh" / "config"


def user_known_hosts() -> Path:
    configured = os.environ.get(KNOWN_HOSTS_ENV)
    return Path(configured) if configured else Path.home() / ".ssh" / "known_hosts"
