"""The user's side: the `airflow-sky` CLI, the Python SDK, the in-process engine and its live view."""
