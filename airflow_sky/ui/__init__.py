"""The Airflow 3 plugin that shows a job's training progress in the Airflow UI.

`plugin.SkyProgressPlugin` (registered through the `airflow.plugins` entry point) mounts `app.app` under
`/airflow-sky` in the API server and puts "Training progress" on the DAG run and task instance pages
(external views). `run_jobs` finds a DAG run's jobs in the metadata DB and reads their progress (live
through SkyClusterHook and the job object, else the final progress XCom); `static/` is the page itself.
"""
