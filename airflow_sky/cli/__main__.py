"""`python -m airflow_sky.cli`: the same as the `airflow-sky` command."""

import sys

from airflow_sky.cli import main

sys.exit(main())
