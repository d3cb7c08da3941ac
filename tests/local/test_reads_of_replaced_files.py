"""A record replaced by rename while it is read (the ssh state store's compare-and-swap writes) is read whole.

The read checks the path with lstat (no symlink, FIFO or device) and then opens it; a rename in between swaps
the file. The bytes read must be those of the file opened, never a larger file cut at the smaller one's size.
"""

from __future__ import annotations

import json
import shlex

from airflow_sky.node.client import NodeClient

# On the node: rename a fresh record of a different size over `rec.json`, as fast as it can, for a while.
WRITER = """
import json, os, sys, time
path = sys.argv[1]
end = time.time() + float(sys.argv[2])
i = 0
while time.time() < end:
    i += 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"i": i, "pad": "x" * (100 + (i % 7) * 900)}, f)
    os.replace(tmp, path)
"""


def test_a_file_replaced_by_rename_while_it_is_read_is_read_whole(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        rc, _, _ = client.exec("printf '{\"i\": 0}' > rec.json")
        assert rc == 0
        writer = f"python3 -c {shlex.quote(WRITER)} rec.json 20 > /dev/null 2>&1 &"
        assert client.exec(writer)[0] == 0
        seen = set()
        for _ in range(300):
            raw = client.read_file("rec.json")
            assert raw is not None
            seen.add(json.loads(raw)["i"])  # a cut record does not parse
        assert len(seen) > 10, "the writer did not replace the file while it was read"
        client.exec("pkill -f rec.json; true")
