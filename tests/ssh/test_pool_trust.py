"""A job on an ssh pool host cannot step into another cluster's lane, on real OpenSSH servers.

What decides membership, addresses, host keys and who holds a host lives on the pool's state host (a user
no job runs as) or in the pool definition, never in the home of a user jobs run as. A job runs as its host's
login user, in that user's home, with that user's shell: a command run as that user over SSH stands in for
the job's script here (the same user, home and rights).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.errors import ClusterError
from airflow_sky.infra.base import Node, NodeStatus, ProvisionRequest
from airflow_sky.infra.cluster import Cluster
from airflow_sky.infra.home import KNOWN_HOSTS_ENV
from airflow_sky.infra.ssh.cloud import SshCloud
from airflow_sky.infra.ssh.pools import load_pool
from airflow_sky.node.client import NodeClient
from tests.envs import patched_environ
from tests.ssh.conftest import POOL
from tests.ssh.sshd import SshdPool

POOL_SIZE = 3
SUBNET = 3


@pytest.fixture
def cloud(sshd_pool: SshdPool) -> Iterator[SshCloud]:
    cloud = SshCloud(POOL)
    yield cloud
    for cluster in cloud.clusters():
        cloud.terminate(cluster)
    assert sshd_pool.locked_hosts() == []


def _as_job(cloud: SshCloud, cluster: str, node: Node, script: str) -> tuple[int, str]:
    """Run `script` on `node` as the user its jobs run as (what a job's script can do)."""
    with NodeClient(node, cloud.key_file_for(cluster, node)) as client:
        rc, out, err = client.exec(script, timeout=60)
    return rc, (out + err).decode(errors="replace")


def test_a_job_that_forges_state_records_and_host_locks_on_its_host_redirects_no_other_cluster(
    cloud: SshCloud, sshd_pool: SshdPool
) -> None:
    (attacker,) = cloud.provision(ProvisionRequest("attacker", 1))
    own, state = sshd_pool.hosts[0], sshd_pool.state
    assert attacker.ssh_user == own.user
    forged_nodes = {
        "version": 1,
        "at": 0,
        "data": {
            "pool": POOL,
            "nodes": [
                {
                    "rank": r,
                    "host": attacker.instance_id.partition("#")[0],
                    "token": "t",
                    "gpus": 0,
                    "ip": attacker.internal_ip,
                }
                for r in range(2)
            ],
        },
    }
    forged_lock = json.dumps({"cluster": "victim", "rank": 0, "pool": POOL, "token": "t"})
    # Everything the job can reach: the records where they used to live (the pool's first host), its own
    # host's lock file as it used to be, and the state host's records (another user's home).
    script = f"""
mkdir -p ~/.airflow_sky/state/{POOL}/victim
echo {json.dumps(json.dumps(forged_nodes))} > ~/.airflow_sky/state/{POOL}/victim/nodes.json
rm -f ~/.airflow_sky/host.lock; echo '{forged_lock}' > ~/.airflow_sky/host.lock
mkdir -p {state.home}/.airflow_sky/state/{POOL}/victim 2>/dev/null && echo wrote-state-host
rm -rf {state.home}/.airflow_sky/host-locks 2>/dev/null
ls {state.home} >/dev/null 2>&1 && echo read-state-host
true
"""
    rc, out = _as_job(cloud, "attacker", attacker, script)
    assert rc == 0 and "wrote-state-host" not in out and "read-state-host" not in out, out

    victim = cloud.provision(ProvisionRequest("victim", 2))
    assert [n.ssh_user for n in victim] == [h.user for h in sshd_pool.hosts[1:3]]
    assert [n.ssh_user for n in cloud.nodes("victim")] == [h.user for h in sshd_pool.hosts[1:3]]
    # The attacker's host is still its own: the lock that counts is on the state host.
    assert cloud.nodes("attacker")[0].status is NodeStatus.RUNNING
    cluster = Cluster("victim", f"ssh/{POOL}", cloud)
    for node in victim:
        with cluster.client(node) as client:
            assert client.exec("whoami")[1].decode().strip() == node.ssh_user
    # Teardown frees the attacker's host (its forged lock file named another cluster): nothing stays held.
    cloud.terminate("attacker")
    cloud.terminate("victim")
    assert sshd_pool.locked_hosts() == []


def test_a_node_whose_record_names_another_address_or_host_key_is_refused_before_connecting(
    cloud: SshCloud, sshd_pool: SshdPool
) -> None:
    (victim,) = cloud.provision(ProvisionRequest("target", 1))
    (attacker,) = cloud.provision(ProvisionRequest("other", 1))
    cluster = Cluster("target", f"ssh/{POOL}", cloud)
    elsewhere = dataclasses.replace(
        victim,
        ssh_host=attacker.ssh_host,
        ssh_user=attacker.ssh_user,
        host_key=attacker.host_key,
        internal_ip=attacker.internal_ip,
    )
    with pytest.raises(ClusterError) as raised:
        cluster.client(elsewhere)
    message = str(raised.value)
    assert "refusing to connect" in message and f"address {attacker.ssh_user}@" in message
    assert "host key" in message and "internal IP" in message
    with pytest.raises(ClusterError, match="gives host key for"):
        cluster.client(dataclasses.replace(victim, host_key=attacker.host_key))
    with pytest.raises(ClusterError, match="which is not in the pool"):
        cluster.client(dataclasses.replace(victim, instance_id="someone@10.9.9.9#t"))
    with pytest.raises(ClusterError, match="refusing to connect"):  # an ssh config written for users too
        cluster.key_files([elsewhere])
    with cluster.client(victim) as client:  # the pool's own node connects
        assert client.exec("whoami")[1].decode().strip() == victim.ssh_user


def test_host_keys_come_from_the_pool_file_and_a_wrong_one_is_refused(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")  # no key from the worker's known_hosts: only the pool file's
    hosts = sshd_pool.hosts[:1]
    right = "\n".join(f"    - ip: {h.alias}\n      host_key: {h.public_host_key()}" for h in hosts)
    wrong = f"    - ip: {hosts[0].alias}\n      host_key: {sshd_pool.hosts[1].public_host_key()}"
    state = f"  state: {{host: {sshd_pool.state.alias}, host_key: {sshd_pool.state.public_host_key()}}}\n"
    pools = tmp_path / "pools.yaml"
    key = f"  identity_file: {sshd_pool.client_key}\n"
    pools.write_text(f"pinned:\n{key}{state}  hosts:\n{right}\nwrong:\n{key}{state}  hosts:\n{wrong}\n")
    with patched_environ({KNOWN_HOSTS_ENV: str(empty)}):
        cloud = SshCloud(pool_obj=load_pool("pinned", [pools]))
        try:
            (node,) = cloud.provision(ProvisionRequest("pinned", 1))
            assert node.host_key == hosts[0].public_host_key()
        finally:
            cloud.terminate("pinned")
        with pytest.raises(ClusterError, match="not enough free hosts") as raised:
            SshCloud(pool_obj=load_pool("wrong", [pools])).provision(ProvisionRequest("wrong", 1))
        assert "host key does not match" in str(raised.value)
    assert sshd_pool.locked_hosts() == []
