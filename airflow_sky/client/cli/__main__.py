"""`python -m airflow_sky.client.cli`: the same as the `airflow-sky` command."""

import sys

from airflow_sky.client.cli import main

sys.exit(main())
