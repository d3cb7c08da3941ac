"""The progress view as a browser shows it: headless Chromium through playwright, and what its DOM says.

The DOM contract (docs/architecture.md, the UI plugin): one `section.sky-job` per job with job fields
(`[data-field=step|total|percent|eta|slowest-rank|generation|updated]`), one `tr.sky-rank[data-rank]` per
rank (`td[data-field=step|rate]`, `td[data-metric=NAME]`, `a[data-log-rank]`), one `svg.sky-chart[data-metric]`
per metric, `li.sky-recovery[data-generation][data-ranks]` per recovery, and a root element carrying
`data-loaded` and `data-refreshes`. `read_view` turns that into plain data; the rules that judge it are pure.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections.abc import Iterator
from typing import Any

from playwright.sync_api import Browser, Page, sync_playwright

# Debian's Chromium (scripts/bootstrap.sh installs it), never a downloaded one; no sandbox (root in CI),
# nothing fetched from the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Evaluated in the page: the contract's elements as JSON (texts trimmed; a job field outside the rank rows).
_READ_VIEW_JS = """
() => {
  const text = (el) => (el ? el.textContent.trim() : null);
  const root = document.querySelector('[data-refreshes]');
  const jobField = (section, name) => text(
    [...section.querySelectorAll(`[data-field="${name}"]`)].find((el) => !el.closest('tr.sky-rank')));
  const jobs = [...document.querySelectorAll('section.sky-job')].map((section) => ({
    cluster: section.dataset.cluster,
    job_id: section.dataset.jobId,
    fields: Object.fromEntries(['step', 'total', 'percent', 'eta', 'slowest-rank', 'generation', 'updated']
      .map((name) => [name, jobField(section, name)])),
    ranks: Object.fromEntries([...section.querySelectorAll('tr.sky-rank')].map((row) => [row.dataset.rank, {
      stale: row.classList.contains('stale'),
      step: text(row.querySelector('td[data-field="step"]')),
      rate: text(row.querySelector('td[data-field="rate"]')),
      metrics: Object.fromEntries([...row.querySelectorAll('td[data-metric]')]
        .map((cell) => [cell.dataset.metric, text(cell)])),
      log: (row.querySelector('a[data-log-rank]') || section.querySelector(
        `a[data-log-rank="${row.dataset.rank}"]`) || {}).href || null,
    }])),
    charts: Object.fromEntries([...section.querySelectorAll('svg.sky-chart')].map((svg) => [
      svg.dataset.metric, svg.querySelectorAll('path, polyline').length])),
    recoveries: [...section.querySelectorAll('li.sky-recovery')].map((li) => ({
      generation: li.dataset.generation, ranks: li.dataset.ranks, text: text(li)})),
  }));
  return {
    loaded: root ? root.dataset.loaded === 'true' : false,
    refreshes: root ? Number(root.dataset.refreshes) : 0,
    jobs,
  };
}
"""


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """Headless Debian Chromium; closed (and playwright's driver stopped) whatever happens."""
    executable = shutil.which("chromium")
    if executable is None:
        raise RuntimeError("chromium is not on PATH (scripts/bootstrap.sh --tests installs Debian's)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def log_in(page: Page, base_url: str, username: str, password: str, timeout_ms: float) -> None:
    """Sign in through the simple auth manager's own login page, as a user would; the JWT cookie it sets
    then authenticates the pages and the plugin's API alike."""
    page.goto(f"{base_url}/auth/login", timeout=timeout_ms)
    page.locator('input[name="username"]').fill(username, timeout=timeout_ms)
    page.locator('input[name="password"]').fill(password, timeout=timeout_ms)
    page.get_by_role("button", name="Sign in").click(timeout=timeout_ms)
    page.wait_for_function(
        "() => document.cookie !== undefined && !location.pathname.startsWith('/auth/')", timeout=timeout_ms
    )


def read_view(page: Page) -> dict[str, Any]:
    """What the progress view shows now (see the module docstring)."""
    return dict(page.evaluate(_READ_VIEW_JS))


def job_of(view: dict[str, Any], cluster: str) -> dict[str, Any] | None:
    return next((job for job in view["jobs"] if job["cluster"] == cluster), None)


def number(text: str | None) -> float | None:
    """A shown number (the view writes plain numbers); None when the cell is empty or not a number."""
    try:
        value = float(str(text).replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def rank_steps(job: dict[str, Any]) -> dict[int, tuple[int, float | None]]:
    """Each shown rank's (step, loss); a rank without a step yet is left out, and so is a stale one (the
    view marks a rank whose report is old or of an earlier generation than the job's)."""
    shown = {}
    for rank, row in job["ranks"].items():
        step = number(row["step"])
        if step is not None and not row["stale"]:
            shown[int(rank)] = (int(step), number(row["metrics"].get("loss")))
    return shown


class Advance:
    """Each rank's reads since a baseline: a read is kept when the rank's shown step changed and its loss
    is a number (a rank reports its loss at each progress line, so the first reads of a generation may
    lack it). Enough once every rank has `reads` of them; the test judges that their steps strictly grow."""

    def __init__(self, ranks: int, reads: int, baseline: dict[int, tuple[int, float | None]]) -> None:
        self.ranks, self.reads = ranks, reads
        self.baseline = {rank: step for rank, (step, _) in baseline.items()}
        self.seen: dict[int, list[tuple[int, float | None]]] = {rank: [] for rank in range(ranks)}

    def add(self, shown: dict[int, tuple[int, float | None]]) -> None:
        for rank, (step, loss) in shown.items():
            reads = self.seen.setdefault(rank, [])
            last = reads[-1][0] if reads else self.baseline.get(rank)
            if step != last and loss is not None:
                reads.append((step, loss))

    def done(self) -> bool:
        return all(len(self.seen.get(rank, [])) >= self.reads for rank in range(self.ranks))
