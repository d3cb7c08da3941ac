"""How a cloud node learns that it is about to be preempted: shell for the node's notice watcher
(node.notice), one per cloud. Each prints the epoch second the node goes at, once the cloud has said so, and
nothing before.

- AWS: the instance metadata service (IMDSv2: a session token first) answers
  `latest/meta-data/spot/instance-action` with 404 until a spot interruption is scheduled, two minutes ahead.
- GCP: `computeMetadata/v1/instance/preempted` (header `Metadata-Flavor: Google`) says `TRUE` once the spot VM
  is being preempted, 30 seconds ahead.

The deadline is the cloud's fixed window from when the watcher first saw the notice: nothing the metadata
service sends is parsed. `[sky] metadata_url` (AIRFLOW__SKY__METADATA_URL) points the nodes at another
service, a stand-in for tests.
"""

from __future__ import annotations

import shlex

AWS_METADATA_URL = "http://169.254.169.254"
GCP_METADATA_URL = "http://metadata.google.internal"
AWS_WINDOW_S = 120.0
GCP_WINDOW_S = 30.0
_CURL = "curl -sf -m 2"  # every node image the clouds' drivers boot has curl; -f: an HTTP error is no answer


def metadata_url(default: str) -> str:
    """The metadata service the nodes ask (`[sky] metadata_url`, else the cloud's own)."""
    from airflow_sky.node.settings import sky_setting

    return (sky_setting("metadata_url") or default).rstrip("/")


def aws_check(base: str = AWS_METADATA_URL) -> str:
    b = shlex.quote(base)
    return (
        f"t=$({_CURL} -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' {b}/latest/api/token) && "
        f'{_CURL} -o /dev/null -H "X-aws-ec2-metadata-token: $t" {b}/latest/meta-data/spot/instance-action '
        f"&& echo $(( $(date +%s) + {int(AWS_WINDOW_S)} ))"
    )


def gcp_check(base: str = GCP_METADATA_URL) -> str:
    b = shlex.quote(base)
    return (
        f"[ \"$({_CURL} -H 'Metadata-Flavor: Google' {b}/computeMetadata/v1/instance/preempted)\" = TRUE ] "
        f"&& echo $(( $(date +%s) + {int(GCP_WINDOW_S)} ))"
    )
