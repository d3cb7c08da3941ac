"""The CLI's tables, fitted to the terminal: every row on one line, no line wider than the console.

A table that would not fit gives way in a fixed order: first a long name is cut (with an ellipsis), down to
NAME_MIN cells (never below its header), then the columns that say least go one by one (`Column.drop`: 1
first) until it fits, and the name takes what room is left. Headers are never cut, ids and statuses stay
whole, and cells are text, never markup (a job's name or a host's answer is anyone's). Should the columns
that always show not fit even so, the name keeps NAME_MIN cells and the console crops the right edge.

    table = fitted_table([Column("ID"), Column("NAME", name=True), Column("NODES", drop=1)], rows, width)
    console.print(table)
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, JustifyMethod
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

NAME_MIN = 10  # a longer name is cut to this before a column is dropped, and never below it
_WIDE = 100_000

Cell = str | Text


@dataclasses.dataclass(frozen=True)
class Column:
    """One column: `drop` is its place in the order columns go when the table is too wide (1 goes first;
    None: it always shows); `name` marks the one free-text column, cut with an ellipsis instead."""

    header: str
    drop: int | None = None
    name: bool = False
    justify: JustifyMethod = "left"


def terminal_console() -> Console:
    """A console for tables: as wide as the terminal (or $COLUMNS), 80 columns when not a terminal."""
    return Console(highlight=False, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 80)


def fitted_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, **options: Any
) -> Table:
    """A rich Table of `rows` (one cell per column) that fits `width` console cells; `options` are the
    Table's own (title, box, padding...)."""
    cells = [[cell if isinstance(cell, Text) else Text(cell) for cell in row] for row in rows]
    natural = [
        max([cell_len(column.header), *(row[i].cell_len for row in cells)])
        for i, column in enumerate(columns)
    ]
    name = next((i for i, column in enumerate(columns) if column.name), None)
    active = list(range(len(columns)))
    overhead = functools.partial(_overhead, options=tuple(sorted(options.items(), key=lambda kv: kv[0])))

    def needed(name_width: int) -> int:
        return sum(name_width if i == name else natural[i] for i in active) + overhead(len(active))

    floor = 0 if name is None else min(natural[name], max(NAME_MIN, cell_len(columns[name].header)))
    for _, dropped in sorted((c.drop, i) for i, c in enumerate(columns) if c.drop is not None):
        if needed(floor) <= width:
            break
        active.remove(dropped)
    table = Table(**options)
    for i in active:
        column = columns[i]
        if i == name:
            room = width - needed(0)
            table.add_column(
                column.header,
                width=max(min(natural[i], room), floor),
                no_wrap=True,
                overflow="ellipsis",
                justify=column.justify,
            )
        else:
            table.add_column(column.header, no_wrap=True, min_width=natural[i], justify=column.justify)
    for row in cells:
        table.add_row(*(row[i] for i in active))
    return table


@functools.cache
def _overhead(count: int, options: tuple[tuple[str, Any], ...]) -> int:
    """What a table with these options adds to `count` columns' contents: padding and rules."""
    kept = {k: v for k, v in options if k not in ("title", "caption")}
    probe = Table(**kept)
    for _ in range(count):
        probe.add_column(width=1)
    console = Console(width=_WIDE, file=io.StringIO())
    return Measurement.get(console, console.options, probe).maximum - count
