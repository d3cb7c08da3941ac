"""`airflow-sky launch --dryrun`: what the task would run on and what it would cost, as `sky launch` shows it."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape

from airflow_sky.client.cli.tables import Column, fitted_table
from airflow_sky.task import Task

_ROWS = 6  # the chosen offering and the next cheapest instance types
# On a narrow terminal the instance is cut first (a local or ssh row names its machines there), then
# Mem(GB), vCPUs and GPUS go in that order.
_COLUMNS = (
    Column("INFRA"),
    Column("INSTANCE", name=True),
    Column("vCPUs", drop=2),
    Column("Mem(GB)", drop=1),
    Column("GPUS", drop=3),
    Column("COST ($)"),
    Column("CHOSEN"),
)


def print_plan(task: Task, infra: str, console: Console) -> None:
    from airflow_sky.infra import catalog
    from airflow_sky.infra.optimizer import best_per_instance_type, network_note, plan
    from airflow_sky.infra.provisioning import container_note

    cloud = infra.split("/", 1)[0].lower()
    rows: list[list[str]] = []

    def print_table() -> None:
        title = f"Considered resources ({task.num_nodes} node{'s' if task.num_nodes != 1 else ''})"
        # SkyPilot's plain layout (no vertical rules), fitted to the terminal (client/cli/tables.py).
        options = {"box": box.SIMPLE_HEAD, "pad_edge": False, "padding": (0, 1, 0, 0), "show_edge": False}
        console.print(fitted_table(_COLUMNS, rows, console.width, title=title, **options))

    if cloud in ("local", "ssh"):
        what = "this machine" if cloud == "local" else f"the hosts of pool {infra.split('/', 1)[-1]}"
        gpus = (
            f"{task.resources.accelerator_name}:{task.resources.accelerator_count}"
            if task.resources.accelerator_name
            else "-"
        )
        rows.append([infra, f"{task.num_nodes} x {what}", "-", "-", gpus, "0.00", "✔"])
        print_table()
        return
    resources = task.resources
    if infra != resources.infra:  # --infra (a cloud, a region, or `*` for any) overrides the task's
        resources = resources.copy(infra=infra)
    choices = best_per_instance_type(plan(resources, task.num_nodes))[:_ROWS]
    for i, choice in enumerate(choices):
        o = choice.offering
        rows.append(
            [
                f"{o.cloud.upper()} ({o.zone})",
                o.instance_type + ("[Spot]" if choice.use_spot else ""),  # SkyPilot's spelling
                f"{o.vcpus:g}",
                f"{o.memory_gib:g}",
                f"{o.accelerator}:{o.accelerator_count}" if o.accelerator else "-",
                f"{choice.cost:.2f}",
                "✔" if i == 0 else "",
            ]
        )
    print_table()
    note = network_note(choices[0], resources) if choices else None
    if note:
        console.print(escape(note))
    container = container_note(resources)
    if container:
        console.print(escape(container))
    meta = catalog.meta()
    console.print(
        f"Cost per hour for all nodes; prices from the catalog of {meta['as_of']} ({meta['source']})."
    )
