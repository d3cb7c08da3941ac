"""Port rules every infra shares: a task's `resources.ports` ('8080', '10000-10010') as numbers, and the
ports of a cluster that a later launch asks more of (SkyPilot's rule: the union)."""

from __future__ import annotations

from collections.abc import Iterable


def port_numbers(ports: Iterable[str]) -> list[int]:
    """('8080', '10000-10002') -> [8080, 10000, 10001, 10002]: each port once, in order."""
    numbers: set[int] = set()
    for item in ports:
        lo, _, hi = item.partition("-")
        numbers.update(range(int(lo), int(hi or lo) + 1))
    return sorted(numbers)


def port_ranges(numbers: Iterable[int]) -> tuple[str, ...]:
    """[22, 8080, 8081, 8082] -> ('22', '8080-8082'): runs of consecutive ports as one range."""
    ranges: list[tuple[int, int]] = []
    for number in sorted(set(numbers)):
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], number)
        else:
            ranges.append((number, number))
    return tuple(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)


def ports_to_open(opened: Iterable[str], asked: Iterable[str] | None) -> tuple[str, ...] | None:
    """The ports a cluster that has `opened` must have for a task that asks `asked`: as SkyPilot's launch
    onto an existing cluster, the union (nothing an earlier job opened is closed under it); None when
    nothing new is asked."""
    have = set(port_numbers(opened))
    want = set(port_numbers(asked or ()))
    if want <= have:
        return None
    return port_ranges(have | want)
