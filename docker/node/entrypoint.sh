#!/bin/bash
# Start sshd with this node's host key (from the keys volume) and the pool's public key for user `sky`.
set -euo pipefail
name=${SKY_NODE_NAME:?SKY_NODE_NAME names this node in the keys volume}
keys=/keys
for _ in $(seq 60); do [ -f "$keys/$name/ssh_host_ed25519_key" ] && break; sleep 1; done
install -m 0600 "$keys/$name/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
install -m 0644 "$keys/$name/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
install -d -m 0700 -o sky -g sky /home/sky/.ssh
install -m 0600 -o sky -g sky "$keys/id_ed25519.pub" /home/sky/.ssh/authorized_keys
exec /usr/sbin/sshd -D -e -o HostKey=/etc/ssh/ssh_host_ed25519_key -o PasswordAuthentication=no
