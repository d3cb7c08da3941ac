"""The embedded local infra: node processes on this machine, each an SSH server on its own loopback address."""
