"""`airflow-sky ssh <cluster>` on a cluster whose jobs run in containers (`image_id: docker:`): land in the
node's container, as SkyPilot's `ssh <cluster>` does; run a given command there too.

The worker names the node's container from the node's instance id (node.container.container_name). Whether
the cluster's jobs run in one is read on the node, by the one command `ssh` runs there: a job record of the
node names that container (the job's wrapper, launch.sh, runs the job in it) and a runtime holds it. Then
the shell is the container's (`<runtime> exec -it`, the node's home bound at its path, as for jobs);
otherwise the node's own, as plain ssh gives it. Nothing else is run on a node without containers: no
runtime is asked.

The cluster's ssh config entries (`ssh <cluster>` with OpenSSH itself, scp, rsync) still reach the node:
its home, where workdir, job outputs and mounts live, is the container's too.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from airflow_sky.node.paths import JOBS_DIR


def remote_command(container: str, command: Sequence[str]) -> str:
    """What `ssh` runs on the node: `command` (joined as ssh joins it) or a login shell, in the node's
    container `container` when the node's jobs ran in it."""
    q = shlex.quote
    name = q(container)
    text = " ".join(command)
    if text:
        inside = f'-i $([ -t 0 ] && echo -t) -e HOME="$HOME" -w "$HOME" {name} /bin/bash -lc {q(text)}'
        outside = f"eval {q(text)}"
    else:
        inside = f'-it -e HOME="$HOME" -e TERM="${{TERM:-xterm}}" -w "$HOME" {name} /bin/bash -l'
        outside = 'exec "${SHELL:-/bin/bash}" -l'
    return f"""\
if grep -qsF -- {name} "$HOME"/{JOBS_DIR}/*/gen-*/launch.sh; then
  for rt in docker podman; do
    command -v "$rt" >/dev/null 2>&1 || continue
    timeout 30 "$rt" container inspect {name} >/dev/null 2>&1 || continue
    [ "$(timeout 30 "$rt" container inspect --format '{{{{.State.Status}}}}' {name} 2>/dev/null)" = running ] ||
      timeout 120 "$rt" start {name} >/dev/null 2>&1
    exec "$rt" exec {inside}
  done
fi
{outside}"""
