#!/usr/bin/env bash
# Installs everything airflow-sky's demo and tests need on a fresh machine:
# system packages (rsync, OpenSSH client + server, the tools the sshd and namespace tests use), a .venv with the package and its extras, and torch (CPU).
# With --tests, also what only the tests use (PostgreSQL, Redis, Chromium). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AIRFLOW_SKY_VENV:-.venv}
PY=${PYTHON:-python3}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

need_apt=()
command -v rsync >/dev/null || need_apt+=(rsync)
command -v ssh >/dev/null || need_apt+=(openssh-client)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v ps >/dev/null || need_apt+=(procps)
command -v unshare >/dev/null || need_apt+=(util-linux)
command -v mount >/dev/null || need_apt+=(mount)
command -v useradd >/dev/null || need_apt+=(passwd)
# Bucket file_mounts on local and ssh nodes: rclone copies and mounts them, FUSE (fusermount3) mounts.
command -v rclone >/dev/null || need_apt+=(rclone)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v pkill >/dev/null || need_apt+=(procps)
if [ "${1:-}" = "--tests" ]; then
  # The deployment tests: PostgreSQL and Redis for a CeleryExecutor stack, Chromium for the UI screenshots.
  compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need_apt+=(postgresql)
  command -v redis-server >/dev/null || need_apt+=(redis-server)
  command -v chromium >/dev/null || need_apt+=(chromium)
  command -v runuser >/dev/null || need_apt+=(util-linux)
  # Containers (image_id: docker:): Podman with runc for the nodes, rootless for pool users (uidmap), and
  # what the tests build their images and private registry with.
  command -v podman >/dev/null || need_apt+=(podman)
  command -v runc >/dev/null || need_apt+=(runc)
  command -v newuidmap >/dev/null || need_apt+=(uidmap)
  command -v docker-registry >/dev/null || need_apt+=(docker-registry)
  command -v debootstrap >/dev/null || need_apt+=(debootstrap)
  command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
fi
# The ssh-infra tests' hosts log in as users of their own: they need a system python3 on the default PATH.
[ -x /usr/bin/python3 ] || need_apt+=(python3-minimal)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing system packages: ${need_apt[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"; } >"$log" 2>&1; then
    cat "$log"; echo "bootstrap: apt-get install ${need_apt[*]} failed" >&2; exit 1
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.airflow-sky-installed"
# s3:// through ObjectStoragePath needs s3fs. It is a step of its own: in one resolve with [dev,aws,gcp],
# its exact botocore pin (through aiobotocore) sends pip backtracking for more than 15 minutes.
S3FS="apache-airflow-providers-amazon[s3fs]"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing airflow-sky[dev,aws,gcp] and torch (CPU) into $VENV (a few minutes on first run)"
  if ! { "$VENV/bin/pip" install -q --upgrade pip \
        && "$VENV/bin/pip" install -q "torch==2.13.0" \
        && "$VENV/bin/pip" install -q -e ".[dev,aws,gcp]" \
        && "$VENV/bin/pip" install -q "$S3FS"; } >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -40
    echo "bootstrap: pip install failed" >&2; exit 1
  fi
  touch "$stamp"
fi
