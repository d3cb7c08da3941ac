"""The compose file's example: a 2-node job on the pool of the two SSH node containers (`ssh/docker-nodes`).

The pool lives only in the Airflow connection `sky_pool` (made by the `airflow-init` service), so any
worker can run any phase: no file on a worker's disk is read.
"""

from __future__ import annotations

from airflow.sdk import DAG

from airflow_sky import Task, sky_job

hello = Task(
    name="hello",
    num_nodes=2,
    setup='echo "setting up $(hostname)"',
    run='echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES on $(hostname); head: '
    '$(echo "$SKYPILOT_NODE_IPS" | head -n1)"',
)

with DAG("sky_hello", schedule=None, catchup=False, tags=["airflow-sky"]):
    # One cluster per DAG run (the default name), torn down when the job ends.
    sky_job(hello, infra="ssh/docker-nodes", conn_id="sky_pool")
