#!/bin/bash
# Run once by the `keys` service: the pool's client key, a host key per node, the known_hosts lines that
# pin them, and the Airflow connection (JSON) that describes the pool. Idempotent: keys are kept.
set -euo pipefail
keys=/keys
nodes=("$@")
[ -f "$keys/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C airflow-sky-pool -f "$keys/id_ed25519"
: > "$keys/known_hosts.tmp"
for node in "${nodes[@]}"; do
  mkdir -p "$keys/$node"
  [ -f "$keys/$node/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$keys/$node/ssh_host_ed25519_key"
  echo "$node $(cut -d' ' -f1,2 "$keys/$node/ssh_host_ed25519_key.pub")" >> "$keys/known_hosts.tmp"
done
mv "$keys/known_hosts.tmp" "$keys/known_hosts"
python3 - "$keys" "${nodes[@]}" <<'PY'
import json, os, sys
keys, nodes = sys.argv[1], sys.argv[2:]
conn = {
    "conn_type": "sky_ssh_pool",
    "login": "sky",
    "host": ",".join(nodes),
    "port": 22,
    "extra": {
        "private_key": open(os.path.join(keys, "id_ed25519")).read(),
        "known_hosts": open(os.path.join(keys, "known_hosts")).read(),
    },
}
path = os.path.join(keys, "sky_pool.json")
with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
    json.dump(conn, f)
PY
chmod 0644 "$keys/id_ed25519.pub" "$keys/known_hosts"
chmod 0600 "$keys/id_ed25519"
# The Airflow image runs as uid 50000: let it read the connection file, nothing else.
chown 50000:0 "$keys/sky_pool.json"
