"""Which clusters a command means: names, glob patterns (`down 'dev*'`) and `-a/--all`, as sky's.

The clusters known here are the local infra's and every one this machine's index remembers launching
(client/cluster_index.py; the infra stays the source of truth: a remembered one that is gone is reported
gone when acted on). A pattern matches them with fnmatch, as `sky down 'dev*'` matches its clusters.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from airflow_sky.errors import SpecError

_GLOB = frozenset("*?[")


def is_pattern(name: str) -> bool:
    return any(c in _GLOB for c in name)


def known_clusters() -> list[str]:
    """Every cluster known here: the local infra's and the index's, sorted."""
    from airflow_sky.client.cluster_index import read_index
    from airflow_sky.client.engine import bind_private_home
    from airflow_sky.infra.registry import get_cloud

    bind_private_home()
    return sorted({*get_cloud("local").clusters(), *read_index()})


def select(command: str, names: Sequence[str], every: bool) -> tuple[list[str], list[str]]:
    """(the clusters `names`/`every` mean, in order and once each; those of them that came from a pattern
    or --all). A pattern that matches no cluster known here is an error naming it; names are checked as
    cluster names (client/cluster_names.py), with a note for one that is called otherwise here."""
    import sys

    from airflow_sky.client.cluster_names import check_cluster_name, cluster_name_note

    if not names and not every:
        raise SpecError(
            f"{command}: name a cluster, a glob pattern ('dev*'), or give -a/--all for every cluster "
            "(see `airflow-sky status`)"
        )
    if every:
        if names:
            print(f"Both --all and cluster(s) given to `{command}`: --all takes effect.")
        found = known_clusters()
        return found, found
    chosen: list[str] = []
    matched: list[str] = []
    known: list[str] | None = None
    for name in names:
        if is_pattern(name):
            known = known_clusters() if known is None else known
            hits = fnmatch.filter(known, name)
            if not hits:
                listed = ", ".join(known) if known else "none"
                raise SpecError(f"{command}: no cluster matches {name!r} (clusters known here: {listed})")
            matched.extend(hits)
            chosen.extend(hits)
            continue
        note = cluster_name_note(name)
        if note is not None:
            print(f"airflow-sky: note: {note}", file=sys.stderr)
        chosen.append(check_cluster_name(name))
    unique = list(dict.fromkeys(chosen))
    return unique, [n for n in unique if n in matched]
