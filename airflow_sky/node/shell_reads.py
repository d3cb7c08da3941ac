"""Shell functions for reading files on a node that a job can reach (the job runs as the node's user).

A job may link its pid, exit code or log to /dev/zero, or make them FIFOs: `regular` refuses all but
regular files (a link is never followed), and `small` reads at most 64 bytes of one within a deadline.
"""

from __future__ import annotations

READ_TIMEOUT_S = 10
READ_SMALL = f"""\
regular() {{ [ -f "$1" ] && [ ! -L "$1" ]; }}
small() {{ regular "$1" && timeout {READ_TIMEOUT_S} head -c 64 -- "$1" 2>/dev/null; }}"""
