"""What collecting progress costs: an N-node local job whose every rank reports progress every second, vs the
same job printing a plain line every second (the baseline, measured in this process).

Prints both launches' wall times (`airflow-sky launch`, provisioning included) and their ratio, and the
progress records' writes to the state store per rank per minute of the run (a record's version counts its
writes; the collector writes at most every WRITE_INTERVAL_S, so at most 20 a minute).

Usage: python bench/bench_progress.py [--nodes 64] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from bench_scale import CLI, REPO, _env, _launch
from common import header

PLAIN = 'for i in $(seq 1 {n}); do echo "plain line $i of rank $SKYPILOT_NODE_RANK"; sleep 1; done'
REPORT = (
    "for i in $(seq 1 {n}); do "
    'echo "@@airflow-sky-progress/1 {{\\"step\\":$i,\\"total\\":{n},\\"time\\":$(date +%s.%N),'
    '\\"metrics\\":{{\\"loss\\":$((1000 / i)),\\"tokens/s\\":18400}}}}"; sleep 1; done'
)


def _job(state: Path, name: str, nodes: int, run: str) -> tuple[float, dict[int, tuple[int, int, float]]]:
    """Launch the job on a fresh cluster; its wall time and per rank (writes, steps kept, seconds reported)."""
    task = state / f"{name}.yaml"
    task.write_text(f"name: {name}\nnum_nodes: {nodes}\nrun: {json.dumps(run)}\n")
    seconds, output, rc = _launch(state, name, task, down=False)
    try:
        if rc != 0:
            print(output[-3000:])
            raise SystemExit(f"the {nodes}-node {name} job failed ({rc})")
        from airflow_sky.infra.local import layout
        from airflow_sky.infra.local.state_store import LocalStateStore

        store = LocalStateStore(layout.state_dir(name))
        ranks: dict[int, tuple[int, int, float]] = {}
        for rank in range(nodes):
            record = store.get(f"progress/1/{rank}")
            if record is not None:
                history = record.data["history"]
                ranks[rank] = (record.version, len(history), history[-1][0] - history[0][0])
        return seconds, ranks
    finally:
        subprocess.run([*CLI, "down", name, "-y"], env=_env(state), capture_output=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=64, help="node count of both jobs")
    parser.add_argument("--seconds", type=int, default=30, help="how long each rank runs (one line a second)")
    args = parser.parse_args()
    header()
    times: dict[str, float] = {}
    for name, script in (("plain", PLAIN), ("progress", REPORT)):
        with tempfile.TemporaryDirectory(prefix=f"bench-progress-{name}-") as tmp:
            state = Path(tmp)
            os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
            times[name], ranks = _job(state, f"{name}{args.nodes}", args.nodes, script.format(n=args.seconds))
        print(
            f"{args.nodes} nodes, {args.seconds} s of one line a second, {name}: launch {times[name]:.1f} s",
            flush=True,
        )
        if name == "progress":
            if len(ranks) != args.nodes:
                raise SystemExit(f"only {len(ranks)} of {args.nodes} ranks have a progress record")
            writes = [w for w, _, _ in ranks.values()]
            steps = {s for _, s, _ in ranks.values()}
            per_minute = sum(w / max(span, 1.0) * 60 for w, _, span in ranks.values()) / len(ranks)
            print(
                f"progress records: {min(writes)}-{max(writes)} writes per rank for {args.seconds} steps "
                f"(history points kept per rank: {sorted(steps)}); {per_minute:.1f} writes per rank per minute "
                f"of reporting, {per_minute * args.nodes:.0f} per minute for the job"
            )
    print(f"ratio progress / plain: {times['progress'] / times['plain']:.3f}")


if __name__ == "__main__":
    main()
