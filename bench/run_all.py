"""Run every benchmark in bench/ (each prints ratios against a baseline measured in the same process)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        sys.argv = [str(script)]
        runpy.run_path(str(script), run_name="__main__")
