"""The launch summary's exit codes: per rank for a few nodes, grouped and wrapped for many (pure)."""

from __future__ import annotations

from airflow_sky.client.cli.exit_summary import exit_code_lines


def test_a_few_ranks_are_listed_one_by_one_as_before() -> None:
    assert exit_code_lines("run", {0: 137, 1: 7, 2: 137}, 80) == [
        "run exit codes: rank 0: 137, rank 1: 7, rank 2: 137"
    ]
    assert exit_code_lines("setup", {1: None, 0: 0}, 80) == ["setup exit codes: rank 0: 0, rank 1: ?"]
    assert exit_code_lines("run", {}, 80) == []


def test_64_ranks_are_one_short_line_grouped_by_exit_code() -> None:
    codes: dict[int, int | None] = {rank: 0 for rank in range(64)}
    codes[3] = 1
    codes[7] = 137
    assert exit_code_lines("run", codes, 80) == [
        "run exit codes: 62 ranks exit 0; rank 3: exit 1; rank 7: exit 137"
    ]


def test_a_failed_64_rank_job_names_the_culprit_and_counts_the_killed() -> None:
    codes: dict[int, int | None] = {rank: 137 for rank in range(64)}
    codes[5] = 4
    codes[6] = None
    assert exit_code_lines("run", codes, 80) == [
        "run exit codes: 62 ranks exit 137; rank 5: exit 4; rank 6: no exit code"
    ]


def test_runs_of_ranks_are_ranges_and_long_lists_wrap_to_the_width_between_entries() -> None:
    codes: dict[int, int | None] = {rank: 0 if rank % 2 else 137 for rank in range(64)}
    codes.update({10: 1, 11: 1, 12: 1})
    lines = exit_code_lines("run", codes, 60)
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines), lines
    text = " ".join(line.strip() for line in lines)
    assert text.startswith("run exit codes: 31 ranks exit 0; ranks 0, 2, 4, 6, 8, 14, 16,")
    assert "; ranks 10-12: exit 1" in text and "62: exit 137;" in text
    # Continuation lines line up under the first entry, and no entry is cut inside "rank N: exit C".
    assert all(line.startswith(" " * len("run exit codes: ")) for line in lines[1:])
    assert not any(line.rstrip().endswith(("rank", "ranks", ":")) for line in lines)


def test_every_rank_different_on_a_narrow_terminal_still_fits() -> None:
    codes: dict[int, int | None] = {rank: rank for rank in range(64)}
    lines = exit_code_lines("run", codes, 40)
    assert all(len(line) <= 40 for line in lines), lines
    assert lines[:2] == ["run exit codes: rank 0: exit 0;", "                rank 1: exit 1;"]
    assert sum(line.count("rank ") for line in lines) == 64
