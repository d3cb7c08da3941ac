"""The summary's exit codes of one phase as lines that fit the terminal: per rank for a few nodes, grouped
by exit code for many ("62 ranks exit 0; rank 3: exit 1; rank 7: exit 137")."""

from __future__ import annotations

from collections.abc import Mapping

PER_RANK_UP_TO = 8  # more ranks than this are grouped by exit code
_MIN_TEXT_WIDTH = 24  # continuation lines align under the first code unless that leaves less than this


def exit_code_lines(phase: str, codes: Mapping[int, int | None], width: int) -> list[str]:
    """`{phase} exit codes: ...` wrapped to `width` columns, never inside one rank's entry."""
    if not codes:
        return []
    if len(codes) <= PER_RANK_UP_TO:
        entries = [[f"rank {rank}: {_short(code)}"] for rank, code in sorted(codes.items())]
        separator = ","
    else:
        entries = _grouped(codes)
        separator = ";"
    words: list[str] = []
    for i, entry in enumerate(entries):
        last = i == len(entries) - 1
        words.extend(entry[:-1])
        words.append(entry[-1] if last else entry[-1] + separator)
    return _wrap(f"{phase} exit codes:", words, width)


def _grouped(codes: Mapping[int, int | None]) -> list[list[str]]:
    """The most common code as a count, every other code with the ranks that had it (in rank order)."""
    by_code: dict[int | None, list[int]] = {}
    for rank, code in sorted(codes.items()):
        by_code.setdefault(code, []).append(rank)
    # The largest group first; a tie goes to the lowest code, a missing code last.
    order = sorted(by_code, key=lambda c: (-len(by_code[c]), c is None, c or 0))
    common, *others = order
    entries: list[list[str]] = []
    if len(by_code[common]) > 1:
        entries.append([f"{len(by_code[common])} ranks {_long(common)}"])
    else:
        others = order
    for code in sorted(others, key=lambda c: by_code[c][0]):
        ranks = by_code[code]
        spans = _spans(ranks)
        words = [span + "," for span in spans[:-1]] + [f"{spans[-1]}: {_long(code)}"]
        words[0] = ("rank " if len(ranks) == 1 else "ranks ") + words[0]
        entries.append(words)
    return entries


def _spans(ranks: list[int]) -> list[str]:
    """Sorted ranks as runs: [0, 1, 2, 5] -> ["0-2", "5"]."""
    spans: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return spans


def _wrap(head: str, words: list[str], width: int) -> list[str]:
    indent = " " * (len(head) + 1)
    if width - len(indent) < _MIN_TEXT_WIDTH:
        indent = "  "
    lines: list[str] = []
    line = head
    for word in words:
        if line != head and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = indent + word
        else:
            line += " " + word
    lines.append(line)
    return lines


def _short(code: int | None) -> str:
    return "?" if code is None else str(code)


def _long(code: int | None) -> str:
    return "no exit code" if code is None else f"exit {code}"
