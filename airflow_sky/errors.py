"""One exception hierarchy for airflow-sky; every user-facing failure is a SkyError."""

from __future__ import annotations


class SkyError(Exception):
    """Base class: its message is one line a user can act on."""


class SpecError(SkyError, ValueError):
    """An invalid task spec (YAML or Python). The message names the file, the field path and what is allowed."""


class ClusterError(SkyError):
    """A cluster could not be provisioned, found, reached or torn down."""


class RemoteError(SkyError):
    """A command or transfer on a node failed."""


class JobFailed(SkyError):
    """A job phase (setup or run) ended with a non-zero exit code on some node."""

    def __init__(
        self, message: str, *, status: str = "FAILED", rank: int | None = None, exit_code: int | None = None
    ):
        super().__init__(message)
        self.status = status
        self.rank = rank
        self.exit_code = exit_code
