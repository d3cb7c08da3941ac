"""The progress line format: table-driven cases, and a seeded fuzz of the parser (hypothesis is not in the
dev dependencies: the fuzz draws from `random` with fixed seeds, so a failure replays exactly)."""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path

import pytest

from airflow_sky.progress import (
    MARKER,
    MAX_METRICS,
    MAX_REPORT_BYTES,
    Report,
    ReportReader,
    format_line,
    parse_line,
)

GOOD = MARKER + '{"step":12,"total":300,"metrics":{"loss":2.5,"tokens/s":1800},"rank":1,"time":1764806400.5}'


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (GOOD, Report(12, 300, {"loss": 2.5, "tokens/s": 1800.0}, 1, 1764806400.5)),
        (MARKER + '{"step":0}', Report(0)),
        (GOOD + "\r\n", Report(12, 300, {"loss": 2.5, "tokens/s": 1800.0}, 1, 1764806400.5)),  # CRLF
        (GOOD + "  \t", Report(12, 300, {"loss": 2.5, "tokens/s": 1800.0}, 1, 1764806400.5)),
        # Text before the marker: a logger's prefix, torchrun's --tee prefix, a progress bar's fragment.
        ("2026-12-04 00:01:02 INFO " + MARKER + '{"step":3}', Report(3)),
        ("[default0]:" + MARKER + '{"step":3}', Report(3)),
        ("\r 45%|████▌     | 45/100 " + MARKER + '{"step":45,"total":100}', Report(45, 100)),
        ("é漢字🙂 " + MARKER + '{"step":3}', Report(3)),  # unicode around it
        # A progress bar redrawn after the report on the same line (a \r, no \n between).
        ("\r 4%|# " + MARKER + '{"step":4}\r 5%|## ', Report(4)),
        # Two reports run together on one line (two writers, no newline between): the last one counts.
        (MARKER + '{"step":1}' + MARKER + '{"step":2}', Report(2)),
        # Integral floats are integers (not every language writes 10 as 10); other keys are ignored.
        (MARKER + '{"step":10.0,"total":2e2,"later":"field"}', Report(10, 200)),
        # An invalid optional field is dropped alone: a NaN loss must not hide the step.
        (MARKER + '{"step":5,"metrics":{"loss":NaN,"acc":0.9}}', Report(5, metrics={"acc": 0.9})),
        (MARKER + '{"step":5,"metrics":{"a":Infinity,"b":-Infinity,"c":1e999}}', Report(5)),
        (MARKER + '{"step":5,"metrics":{"ok":true,"s":"1","l":[1],"n":null,"d":{"x":1}}}', Report(5)),
        (
            MARKER + '{"step":5,"metrics":{"bad name":1,"9lives":1,"":1,"é":1,"ok_1.2/3-x":1}}',
            Report(5, metrics={"ok_1.2/3-x": 1.0}),
        ),
        (MARKER + '{"step":5,"metrics":{"' + "x" * 65 + '":1}}', Report(5)),
        (MARKER + '{"step":5,"metrics":[1,2]}', Report(5)),
        (MARKER + '{"step":5,"total":0,"rank":-1,"time":-3}', Report(5)),
        (MARKER + '{"step":5,"total":1.5,"rank":true,"time":"now"}', Report(5)),
        (MARKER + '{"step":5,"time":NaN}', Report(5)),
    ],
)
def test_a_report_line_parses_to_its_fields(line: str, expected: Report) -> None:
    assert parse_line(line) == expected
    assert parse_line(line.encode()) == expected  # bytes as read from a log, too


@pytest.mark.parametrize(
    "line",
    [
        "",
        "plain log line",
        "step 10/300 loss 2.15",
        '{"step": 1}',  # JSON without the marker is not a report
        MARKER,
        MARKER + "{",
        MARKER + '{"step":1',  # a line cut short
        MARKER + '{"step":1}x',  # something after the object
        MARKER + '{"step":1} {"step":2}',
        MARKER + "[1,2]",
        MARKER + '"step"',
        MARKER + "{}",
        MARKER + '{"step":-1}',
        MARKER + '{"step":1.5}',
        MARKER + '{"step":"1"}',
        MARKER + '{"step":true}',
        MARKER + '{"step":NaN}',
        MARKER + '{"step":Infinity}',
        MARKER + '{"step":null}',
        MARKER + '{"step":' + "9" * 30 + "}",  # past 2**63
        MARKER + '{"step":' + "9" * 4200 + "}",  # past Python's int digit limit
        "@@airflow-sky-progress/2 " + '{"step":1}',  # a later version: not this parser's
        '@@airflow-sky-progress/1{"step":1}',  # no space after the marker
        MARKER + '{"step":1,"metrics":{"x":"' + "y" * MAX_REPORT_BYTES + '"}}',  # over the size limit
        MARKER + "[" * 2000 + "]" * 2000,  # nesting deep enough to exhaust the JSON parser's recursion
        MARKER + '{"step":1}'[:-1] + "\udcff}",  # an unpaired surrogate (invalid UTF-8 when encoded)
    ],
)
def test_a_line_that_is_no_valid_report_parses_to_none(line: str) -> None:
    assert parse_line(line) is None


def test_invalid_utf8_and_nul_bytes_are_no_report_and_no_error() -> None:
    assert parse_line(b"\xff\xfe" + MARKER.encode() + b'{"step":1}') == Report(1)
    assert parse_line(MARKER.encode() + b'{"step":1,"metrics":{"\xff":1}}') == Report(1)
    assert parse_line(MARKER.encode() + b'{"step":\x001}') is None


def test_only_the_first_32_metrics_count() -> None:
    metrics = {f"m{i}": float(i) for i in range(MAX_METRICS + 5)}
    parsed = parse_line(MARKER + json.dumps({"step": 1, "metrics": metrics}))
    assert parsed is not None and list(parsed.metrics) == [f"m{i}" for i in range(MAX_METRICS)]


def test_the_largest_report_a_writer_can_make_fits_the_line_limit() -> None:
    # 32 longest names, the longest float reprs, the largest step and total, a rank and a time.
    metrics = {f"{i:02d}".rjust(64, "m"): -1.7976931348623157e308 for i in range(MAX_METRICS)}
    report = Report(2**63 - 1, 2**63 - 1, metrics, 2**63 - 1, 1.7976931348623157e308)
    line = format_line(report)
    assert len(line.encode()) <= MAX_REPORT_BYTES
    assert parse_line(line) == report


def _random_report(rng: random.Random) -> Report:
    alphabet = "abcXYZ_09./-"
    metrics = {
        rng.choice("abcxyz_") + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))): rng.choice(
            [rng.uniform(-1e6, 1e6), float(rng.randint(-(10**9), 10**9)), 0.0, 1e-300, -1e300]
        )
        for _ in range(rng.randint(0, 8))
    }
    return Report(
        step=rng.randint(0, 10**12),
        total=rng.choice([None, rng.randint(1, 10**12)]),
        metrics=metrics,
        rank=rng.choice([None, rng.randint(0, 1024)]),
        time=rng.choice([None, round(rng.uniform(1.7e9, 1.8e9), 3)]),
    )


@pytest.mark.parametrize("seed", range(5))
def test_fuzz_written_reports_read_back_from_a_log_cut_into_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    noise = [b"plain line", b"\xff\xfe bad utf8", "ünïcödé ✓".encode(), b"", b'{"step": 1}', b"\r 12%|#"]
    reports: list[Report] = []
    log = b""
    for _ in range(300):
        if rng.random() < 0.5:
            report = _random_report(rng)
            reports.append(report)
            log += rng.choice([b"", b"[rank 0/2] ", b"\r 3%|# "]) + format_line(report).encode()
        else:
            log += rng.choice(noise)
        log += rng.choice([b"\n", b"\r\n"])
    reader, got, at = ReportReader(), [], 0
    while at < len(log):  # lines and multi-byte characters split across reads
        size = rng.choice([1, 2, 7, 64, 500, 5000])
        got += reader.feed(log[at : at + size])
        at += size
    got += reader.flush()
    assert got == reports


@pytest.mark.parametrize("seed", range(5))
def test_fuzz_mutated_and_random_lines_never_raise_and_yield_only_valid_reports(seed: int) -> None:
    rng = random.Random(1000 + seed)
    base = format_line(_random_report(rng)).encode()
    for _ in range(3000):
        line = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(line) + 1)
            op = rng.random()
            if op < 0.4 and line:
                del line[at : at + rng.randint(1, 8)]
            elif op < 0.8:
                line[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            else:
                line[at:at] = rng.choice([b"NaN", b"Infinity", b"-1", b"1e999", b'"', b"{", b"}", b"\\u0000"])
        for candidate in (bytes(line), bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))):
            parsed = parse_line(candidate)
            if parsed is not None:
                assert 0 <= parsed.step < 2**63
                assert parsed.total is None or parsed.total >= 1
                assert all(math.isfinite(v) for v in parsed.metrics.values())
                assert len(parsed.metrics) <= MAX_METRICS


def test_a_reader_started_mid_line_skips_to_the_next_line() -> None:
    line = (MARKER + '{"step":7}\n').encode()
    reader = ReportReader(at_line_start=False)
    assert reader.feed(line[5:]) == []  # the tail of a line read from a resumed offset
    assert reader.feed(line) == [Report(7)]


def test_a_reader_keeps_a_bounded_tail_of_an_endless_line() -> None:
    reader = ReportReader()
    for _ in range(100):
        assert reader.feed(b"x" * 100_000) == []
    assert len(reader._partial) <= MAX_REPORT_BYTES + 1
    assert reader.feed((MARKER + '{"step":9}\n').encode()) == [Report(9)]
    assert reader.feed((MARKER + '{"step":10}').encode()) == []
    assert reader.flush() == [Report(10)]  # the stream ended without a newline


def test_the_documented_bash_echo_writes_a_report() -> None:
    script = 'step=3; LOSS=0.5; echo "@@airflow-sky-progress/1 {\\"step\\":$step,\\"total\\":100,\\"metrics\\":{\\"loss\\":$LOSS}}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60, check=True)
    assert parse_line(done.stdout) == Report(3, 100, {"loss": 0.5})


def test_every_progress_line_in_the_user_guide_parses() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user-guide.md").read_text()
    lines = [line for line in guide.splitlines() if line.startswith(MARKER)]
    assert len(lines) >= 2
    assert all(parse_line(line) is not None for line in lines), lines
    assert (
        'echo "@@airflow-sky-progress/1 {\\"step\\":$step,\\"total\\":100,' in guide
    )  # the bash example above
