"""The coordination core of a job, plain Python (no Airflow import): the job object (gang_job.GangJob:
start, follow, watch, relaunch, cancel, kill, logs), the job state in the infra's state store, the rank
follower and the phase watcher (fail-fast), recovery and relaunch leadership, the cluster's job queue and
teardown leases. It reaches nodes through an infra.cluster.Cluster handed in by the caller, and node files
through node/ helpers.
"""
