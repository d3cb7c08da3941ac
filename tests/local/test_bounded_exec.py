"""A node command's output and time are bounded on the worker (NodeClient.exec), on real local node servers.

A job controls what a node prints: a command writing a gigabyte must not take the worker's memory with it,
and a command that never ends must not hold the worker forever. Both end with an error that names the
command's purpose and the limit, never the command text.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airflow_sky.errors import RemoteError
from airflow_sky.node.client import NodeClient, OutputTooLarge

MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset this process's peak RSS (VmHWM), where the kernel lets us; False where it does not."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _gone_on_node(client: NodeClient, needle: str) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        _, out, _ = client.exec("ps -eo args", purpose="process list")
        if needle not in out.decode():
            return True
        time.sleep(0.5)
    return False


def test_a_command_writing_a_gigabyte_is_stopped_and_the_worker_stays_under_100_mb_extra(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        client.exec("true")  # the connection is open before the measurement starts
        before = _status_kib("VmRSS")
        peak_known = _reset_peak()
        with pytest.raises(OutputTooLarge) as caught:
            # The secret-looking word is in the command only: the error must not carry the command text.
            client.exec(
                "SECRET_WORD=hunter2; head -c 1G /dev/zero | tr '\\0' x; echo never-reached",
                purpose="the output probe",
            )
        extra_mib = ((_status_kib("VmHWM") if peak_known else _status_kib("VmRSS")) - before) / 1024
        message = str(caught.value)
        assert extra_mib < 100, f"the worker grew by {extra_mib:.0f} MiB reading a 1 GB output"
        assert "the output probe on node rank 0" in message
        assert f"more than {8 * MIB} bytes on stdout" in message
        assert message.endswith("x" * 100)  # the tail of what it printed
        assert "hunter2" not in message and "head -c" not in message
        assert _gone_on_node(client, "/dev/zero"), "the writer still runs on the node"
        assert client.exec("echo still-usable") == (0, b"still-usable\n", b"")


def test_the_cap_is_per_call_and_applies_to_stderr_too(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        rc, out, err = client.exec("head -c 3M /dev/zero", max_bytes=4 * MIB)
        assert (rc, len(out), err) == (0, 3 * MIB, b"")
        with pytest.raises(
            OutputTooLarge, match=r"more than 65536 bytes on stderr.* ended with: [.]{3}e{2048}$"
        ):
            client.exec("head -c 1M /dev/zero | tr '\\0' e >&2", max_bytes=65536)


def test_a_command_that_never_ends_is_stopped_at_its_deadline_printing_or_not(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        for command in ("while :; do echo tick; sleep 0.2; done", "sleep 600"):
            started = time.monotonic()
            with pytest.raises(RemoteError, match=r"^the endless probe on node rank 0 .* within 3s"):
                client.exec(command, timeout=3, purpose="the endless probe")
            took = time.monotonic() - started
            assert 3 <= took < 30, f"{command!r} ended after {took:.1f}s with a 3 s limit"
        assert _gone_on_node(client, "sleep 600"), "the stopped command still runs on the node"
