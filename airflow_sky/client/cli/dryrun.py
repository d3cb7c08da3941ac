"""`airflow-sky launch --dryrun`: what the task would run on and what it would cost, as `sky launch` shows it."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from airflow_sky.task import Task

_ROWS = 6  # the chosen offering and the next cheapest instance types


def print_plan(task: Task, infra: str, console: Console) -> None:
    from airflow_sky.infra import catalog
    from airflow_sky.infra.optimizer import best_per_instance_type, network_note, plan
    from airflow_sky.infra.provisioning import container_note

    cloud = infra.split("/", 1)[0].lower()
    # SkyPilot's plain layout (no vertical rules), so a row fits an 80-column terminal.
    table = Table(
        title=f"Considered resources ({task.num_nodes} node{'s' if task.num_nodes != 1 else ''})",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    for column in ("INFRA", "INSTANCE", "vCPUs", "Mem(GB)", "GPUS", "COST ($)", "CHOSEN"):
        table.add_column(column, no_wrap=True)
    if cloud in ("local", "ssh"):
        what = "this machine" if cloud == "local" else f"the hosts of pool {infra.split('/', 1)[-1]}"
        gpus = (
            f"{task.resources.accelerator_name}:{task.resources.accelerator_count}"
            if task.resources.accelerator_name
            else "-"
        )
        table.add_row(infra, f"{task.num_nodes} x {what}", "-", "-", gpus, "0.00", "✔")
        console.print(table)
        return
    resources = task.resources
    if infra != resources.infra:  # --infra (a cloud, a region, or `*` for any) overrides the task's
        resources = resources.copy(infra=infra)
    choices = best_per_instance_type(plan(resources, task.num_nodes))[:_ROWS]
    for i, choice in enumerate(choices):
        o = choice.offering
        table.add_row(
            f"{o.cloud.upper()} ({o.zone})",
            escape(o.instance_type + ("[Spot]" if choice.use_spot else "")),  # SkyPilot's spelling
            f"{o.vcpus:g}",
            f"{o.memory_gib:g}",
            f"{o.accelerator}:{o.accelerator_count}" if o.accelerator else "-",
            f"{choice.cost:.2f}",
            "✔" if i == 0 else "",
        )
    console.print(table)
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
