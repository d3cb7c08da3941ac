"""The coordination core of a job, plain Python (no Airflow import): the job record and queue on the head,
starting and following ranks, fail-fast, recovery and relaunch. It reaches nodes through an
infra.cluster.Cluster handed in by the caller.
"""
