"""Pure helpers: node log prefixes, secret redaction, artifact destinations."""

from __future__ import annotations

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.node.artifacts import destination_uri, validate_destination
from airflow_sky.node.logs import MAX_LINE_BYTES, LineSplitter, node_prefix
from airflow_sky.node.paths import remote_path
from airflow_sky.progress import MARKER, Report, parse_line
from airflow_sky.task.redaction import redactor


def test_prefixes_match_skypilot():
    assert node_prefix(0, 17894, "10.0.0.6") == "(head, rank=0, pid=17894)"
    assert node_prefix(1, 15406, "10.0.0.7") == "(worker1, rank=1, pid=15406, ip=10.0.0.7)"
    assert node_prefix(2, None, "10.0.0.8", setup=True) == "(setup worker2, rank=2, ip=10.0.0.8)"


def test_line_splitter_joins_chunks_and_keeps_the_tail():
    lines: list[str] = []
    splitter = LineSplitter(lines.append, keep=2)
    for chunk in (b"a\nb", b"c\r\nd", b"\n", b"tail without newline"):
        splitter.feed(chunk)
    splitter.flush()
    assert lines == ["a", "bc", "d", "tail without newline"]
    assert list(splitter.tail) == ["d", "tail without newline"]


def test_a_progress_bar_redrawing_its_line_for_hours_keeps_the_reader_bounded_and_shows_its_last_state():
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    # tqdm's way: `\r` and the bar again, never a newline until it closes (here ~6 MB of redraws), with a
    # progress report in one of the redraws.
    bar = [b"\rtrain: %6d/200000 [loss 0.5]" % i for i in range(200_000)]
    bar[1000] = b"\r" + MARKER.encode() + b'{"step": 1000}'
    redraws = b"".join(bar)
    for start in range(0, len(redraws), 65_536):
        splitter.feed(redraws[start : start + 65_536])
        assert splitter.pending_bytes <= MAX_LINE_BYTES  # never the whole history of the bar
    splitter.feed(b"\ndone\n")
    report, last, done = lines
    assert parse_line(report) == Report(1000)  # the report's redraw is not lost with the bar's
    assert len(last) <= MAX_LINE_BYTES and last.rsplit("\r", 1)[-1] == "train: 199999/200000 [loss 0.5]"
    assert done == "done"


def test_a_line_longer_than_the_limit_comes_out_whole_in_pieces():
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    long_line = "".join(chr(ord("a") + i % 26) for i in range(3 * MAX_LINE_BYTES + 100))
    for piece in (long_line[:1000], long_line[1000:], "\nnext"):
        splitter.feed(piece.encode())
        assert splitter.pending_bytes <= MAX_LINE_BYTES
    splitter.flush()
    assert [len(line) for line in lines] == [MAX_LINE_BYTES] * 3 + [100, 4]
    assert "".join(lines[:4]) == long_line and lines[4] == "next"


def test_redactor_hides_secrets_and_each_line_of_multiline_ones():
    redact = redactor(["hunter2", "line-one\nline-two", "ab"])
    assert redact("password=hunter2!") == "password=***!"
    assert redact("got line-two here") == "got *** here"
    assert redact("ab is too short to redact safely") == "ab is too short to redact safely"


def test_artifact_destinations():
    assert destination_uri("s3://b/runs/1/", "~/sky_workdir/model.pt", None) == "s3://b/runs/1/model.pt"
    assert destination_uri("/data/out", "ckpt/last.pt", 1) == "/data/out/rank-1/last.pt"
    assert remote_path("~/sky_workdir/model.pt") == "sky_workdir/model.pt"
    with pytest.raises(SpecError, match="artifacts_to"):
        validate_destination("ftp://host/x")
    with pytest.raises(SpecError, match="does not name a file"):
        destination_uri("/data", "~/", None)


def test_mounts_split_into_local_uploads_and_bucket_mounts():
    from airflow_sky import Task
    from airflow_sky.node.files import local_uploads
    from airflow_sky.task.storage import bucket_mounts

    task = Task(
        run="x",
        file_mounts={
            "~/a": "/srv/data",
            "~/b": "s3://bkt/p",
            "~/c": {"source": "/srv/cfg", "mode": "COPY"},
            "~/d": {"name": "bk1", "store": "gcs"},
            "~/e": {"name": "bk2", "source": "/srv/up", "store": "s3"},
        },
    )
    # A named bucket's local source is uploaded into the bucket, not synced.
    assert local_uploads(task) == [("/srv/data", "~/a"), ("/srv/cfg", "~/c")]
    assert [(m.uri, m.destination, m.mode) for m in bucket_mounts(task)] == [
        ("s3://bkt/p", "~/b", "COPY"),
        ("gs://bk1", "~/d", "MOUNT"),
        ("s3://bk2", "~/e", "MOUNT"),
    ]
    with pytest.raises(SpecError, match=r"file_mounts\.~/e: 'r2://x/y': only s3:// and gs://"):
        bucket_mounts(Task(run="x", file_mounts={"~/e": "r2://x/y"}))
