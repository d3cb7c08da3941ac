"""Pool definitions: SkyPilot's ssh_node_pools.yaml read as it is, and the sky_ssh_pool connection fields."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.infra.ssh.connection import pool_from_fields
from airflow_sky.infra.ssh.pools import POOL_FILE_ENV, Pool, load_pool, parse_pool, pool_files


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_pool"
    path.write_text("not read by the parser\n")
    return path


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_skypilot_pool_file_parses_with_defaults_and_per_host_overrides(tmp_path: Path, key: Path) -> None:
    other = tmp_path / "id_other"
    other.write_text("x")
    pools = _write(
        tmp_path / "pools.yaml",
        f"""
my-box:
  user: ubuntu
  identity_file: {key}
  password: s3cret
  hosts:
    - 192.168.1.10
    - ip: 192.168.1.11
      user: admin
      identity_file: {other}
""",
    )
    pool = load_pool("my-box", [pools])
    first, second = pool.hosts
    assert (first.address, first.port, first.user, first.identity_file) == (
        "192.168.1.10",
        22,
        "ubuntu",
        str(key),
    )
    assert (second.address, second.user, second.identity_file) == ("192.168.1.11", "admin", str(other))
    assert first.password == "s3cret" and "s3cret" not in repr(pool)
    assert [h.label for h in pool.hosts] == ["ubuntu@192.168.1.10", "admin@192.168.1.11"]


def test_a_host_alias_takes_hostname_port_user_and_key_from_the_ssh_config(tmp_path: Path, key: Path) -> None:
    config = _write(
        tmp_path / "config", f"Host gpu1\n  HostName 10.1.2.3\n  Port 2201\n  User ml\n  IdentityFile {key}\n"
    )
    pool = parse_pool("p", {"hosts": ["gpu1"]}, "pools.yaml", ssh_config_path=config)
    host = pool.hosts[0]
    assert (host.name, host.address, host.port, host.user, host.identity_file) == (
        "gpu1",
        "10.1.2.3",
        2201,
        "ml",
        str(key),
    )
    assert host.known_hosts_name == "[10.1.2.3]:2201"


def test_our_own_pool_file_is_searched_before_skypilots(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(home / ".airflow_sky"))
    monkeypatch.delenv(POOL_FILE_ENV, raising=False)
    (home / ".sky").mkdir(parents=True)
    (home / ".airflow_sky").mkdir()
    _write(
        home / ".sky" / "ssh_node_pools.yaml",
        f"p:\n  identity_file: {key}\n  hosts: [10.0.0.9]\nonly-sky:\n  identity_file: {key}\n  hosts: [10.0.0.8]\n",
    )
    _write(
        home / ".airflow_sky" / "ssh_node_pools.yaml", f"p:\n  identity_file: {key}\n  hosts: [10.0.0.1]\n"
    )
    assert pool_files() == [
        home / ".airflow_sky" / "ssh_node_pools.yaml",
        home / ".sky" / "ssh_node_pools.yaml",
    ]
    assert load_pool("p").hosts[0].address == "10.0.0.1"
    assert load_pool("only-sky").hosts[0].address == "10.0.0.8"
    monkeypatch.setenv(POOL_FILE_ENV, str(home / ".sky" / "ssh_node_pools.yaml"))
    assert load_pool("p").hosts[0].address == "10.0.0.9"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("p:\n  hosts: []\n", "pools.yaml: pool 'p': hosts: required, a non-empty list"),
        ("p:\n  user: u\n", "pools.yaml: pool 'p': hosts: required"),
        ("p:\n  usr: u\n  hosts: [1.2.3.4]\n", "pool 'p': usr: unknown field; did you mean 'user'?"),
        ("p:\n  hosts:\n    - user: u\n", "pool 'p': hosts[0]: ip: required in a host mapping"),
        (
            "p:\n  hosts:\n    - 1.2.3.4\n    - ip: 1.2.3.5\n      identity_fil: k\n",
            "pool 'p': hosts[1]: identity_fil: unknown field; did you mean 'identity_file'?",
        ),
        (
            "p:\n  identity_file: /nonexistent/key\n  hosts: [1.2.3.4]\n",
            "pool 'p': hosts[0]: identity_file: '/nonexistent/key' does not exist",
        ),
        (
            "p:\n  hosts: [1.2.3.4, 1.2.3.4]\n",
            "pool 'p': hosts[1]: KEY@1.2.3.4 is listed twice (also hosts[0])",
        ),
        (
            "p:\n  hosts:\n    - [1, 2]\n",
            "pool 'p': hosts[0]: a host is an IP, an ssh-config alias or a mapping",
        ),
        (
            "p:\n  password: 7\n  hosts: [1.2.3.4]\n",
            "pool 'p': password: must be a non-empty string, got a value",
        ),
        ("- p\n", "a pool file is a mapping of pool names to pools"),
        ("p: [\n", "pools.yaml"),
    ],
)
def test_pool_errors_name_the_file_pool_host_index_and_field(
    tmp_path: Path, key: Path, body: str, expected: str
) -> None:
    if "identity_file" not in body:
        body = body.replace("p:\n", f"p:\n  identity_file: {key}\n", 1)
    path = _write(tmp_path / "pools.yaml", body)
    with pytest.raises(SpecError) as raised:
        load_pool("p", [path])
    message = str(raised.value)
    user = os.environ.get("USER") or __import__("getpass").getuser()
    assert expected.replace("pools.yaml", str(path)).replace("KEY@", f"{user}@") in message, message
    assert "\n" not in message


def test_a_missing_pool_lists_the_pools_that_exist_and_how_to_define_one(tmp_path: Path, key: Path) -> None:
    path = _write(
        tmp_path / "pools.yaml",
        f"a:\n  identity_file: {key}\n  hosts: [1.2.3.4]\nb:\n  identity_file: {key}\n  hosts: [1.2.3.5]\n",
    )
    with pytest.raises(
        SpecError, match=r"ssh pool 'gpus' is not defined in .*pools.yaml; pools defined: a, b"
    ):
        load_pool("gpus", [path])


def test_a_connection_pool_writes_its_key_0600_and_keeps_known_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_SKY_HOME", str(tmp_path / "sky"))
    secret = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
    pool = pool_from_fields(
        "gpus",
        "sky_gpus",
        host="10.0.0.1, 10.0.0.2",
        login="ml",
        password=None,
        port=2222,
        extra={"private_key": secret, "known_hosts": "[10.0.0.1]:2222 ssh-ed25519 AAAAkey1\n"},
    )
    assert [(h.address, h.port, h.user) for h in pool.hosts] == [
        ("10.0.0.1", 2222, "ml"),
        ("10.0.0.2", 2222, "ml"),
    ]
    key_file = Path(str(pool.hosts[0].identity_file))
    assert key_file.read_text() == secret and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert pool.known_hosts == ("[10.0.0.1]:2222 ssh-ed25519 AAAAkey1",)
    assert secret not in repr(pool)


def test_a_connection_pool_refuses_unknown_extra_fields_by_name() -> None:
    with pytest.raises(SpecError, match=r"Airflow connection 'c': extra: unknown field\(s\) hostz"):
        pool_from_fields("p", "c", host="1.2.3.4", login=None, password=None, port=None, extra={"hostz": []})


def _ubuntu_conn(port: int | None, extra: dict[str, object]) -> Pool:
    """Connection `boxes` holding pool `p`: host 10.0.0.1 as ubuntu."""
    return pool_from_fields(
        "p", "boxes", host="10.0.0.1", login="ubuntu", password=None, port=port, extra=extra
    )


def test_a_pool_without_a_state_host_is_refused_naming_the_field(tmp_path: Path, key: Path) -> None:
    from airflow_sky.infra.ssh.cloud import SshCloud

    pool = parse_pool("p", {"identity_file": str(key), "hosts": ["10.0.0.1"]}, "pools.yaml")
    with pytest.raises(SpecError) as raised:
        SshCloud(pool_obj=pool).check_config()
    message = str(raised.value)
    assert message.startswith("pools.yaml: pool 'p': state: required.")
    assert "state: {host: <IP or alias>, user:" in message and "\n" not in message
    conn = _ubuntu_conn(None, {"identity_file": str(key)})
    with pytest.raises(SpecError, match=r"Airflow connection 'boxes': pool 'p': extra.state: required"):
        SshCloud(pool_obj=conn).check_config()


def test_the_state_host_parses_from_the_file_and_the_connection_and_never_is_a_job_host(
    tmp_path: Path, key: Path
) -> None:
    raw = {
        "user": "ubuntu",
        "identity_file": str(key),
        "state": {
            "host": "10.0.0.9",
            "user": "skystate",
            "port": 2200,
            "host_key": "ssh-ed25519 AAAAstate c",
        },
        "hosts": ["10.0.0.1", {"ip": "10.0.0.2", "host_key": "ssh-ed25519 AAAAhost2"}],
    }
    pool = parse_pool("p", raw, "pools.yaml")
    assert pool.state is not None
    assert (pool.state.label, pool.state.identity_file, pool.state.host_key, pool.state.field) == (
        "skystate@10.0.0.9:2200",
        str(key),
        "ssh-ed25519 AAAAstate",
        "state",
    )
    assert [h.host_key for h in pool.hosts] == [None, "ssh-ed25519 AAAAhost2"]
    conn = _ubuntu_conn(2222, {"identity_file": str(key), "state": {"host": "10.0.0.9", "user": "skystate"}})
    assert conn.state is not None and conn.state.label == "skystate@10.0.0.9:2222"
    same = dict(raw, state={"host": "10.0.0.1"})  # the pool's user on a job host: jobs could write there
    with pytest.raises(SpecError, match=r"state: ubuntu@10.0.0.1 is also hosts\[0\], which runs jobs"):
        parse_pool("p", same, "pools.yaml")
    for bad, field in (
        ({"host": "10.0.0.9", "hots": 1}, "state: hots: unknown field"),
        ({"user": "x"}, "state: must be a mapping with `host`"),
        ({"host": "10.0.0.9", "port": "22"}, "state: port: must be a TCP port"),
        ({"host": "10.0.0.9", "host_key": "AAAA"}, "state: host_key: must be `<type> <base64>`"),
    ):
        with pytest.raises(SpecError, match=field):
            parse_pool("p", dict(raw, state=bad), "pools.yaml")
