"""Where airflow-sky keeps client-side files: `~/.airflow_sky` (or $AIRFLOW_SKY_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "AIRFLOW_SKY_HOME"


def sky_home() -> Path:
    configured = os.environ.get(HOME_ENV)
    return Path(configured) if configured else Path.home() / ".airflow_sky"
