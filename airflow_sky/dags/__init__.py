"""Building Airflow DAGs from tasks: sky_job (one job as a TaskGroup) and dags_from_folder."""
