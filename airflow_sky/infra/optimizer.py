"""The optimizer: the cheapest catalog offering that fits a task's resources, for all its nodes.

Pure functions over the catalog (infra.catalog) and Resources, SkyPilot's rules:

- `accelerators`: the model by name (any case) and the count per instance (a fractional count takes an
  instance with one); several candidates in a mapping or set: the cheapest of them; in a list: the first
  that fits anywhere, in the list's order.
- `cpus` / `memory`: `N` exactly, `N+` at least. Without cpus, memory, accelerators or instance_type, the
  default is SkyPilot's: 8+ vCPUs and 4 GiB per vCPU, from the cloud's general-purpose families.
- `instance_type`, `use_spot` (the spot price; zones without one are out), `infra` / `cloud` / `region` /
  `zone`; `any_of`: the cheapest of all; `ordered`: the first alternative that fits anywhere.
- `disk_size` and `image_id` do not change the choice (the catalog prices instances only).
- `network_tier: best`: only types that can honour it (EFA on aws, compact placement on gcp); when none
  that fits can, the error names each refused type and why.

The cost shown is per hour for all `num_nodes` instances.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from airflow_sky.errors import SpecError
from airflow_sky.infra import catalog
from airflow_sky.infra.aws import efa
from airflow_sky.infra.catalog import Offering
from airflow_sky.infra.gcp import fabric
from airflow_sky.task import Resources

# The families SkyPilot picks for CPU-only requests (GPU families are only for accelerator requests).
DEFAULT_CPU_FAMILIES = {
    "aws": ("m6i.", "c6i.", "r6i."),
    "gcp": ("n2-standard-", "n2-highmem-", "n2-highcpu-"),
}
DEFAULT_CPUS = "8+"
DEFAULT_MEMORY_PER_CPU = 4.0


@dataclasses.dataclass(frozen=True)
class Choice:
    """An offering for the whole cluster, and what it costs per hour for all nodes."""

    offering: Offering
    use_spot: bool
    num_nodes: int
    candidate: int  # index of the Resources candidate it fits

    @property
    def cost(self) -> float:
        price = self.offering.hourly(self.use_spot)
        assert price is not None  # unpriced offerings never become choices
        return price * self.num_nodes

    @property
    def infra(self) -> str:
        return f"{self.offering.cloud}/{self.offering.region}/{self.offering.zone}"


def _matches_count(spec: str | None, value: float) -> bool:
    if spec is None:
        return True
    text = str(spec)
    if text.endswith("+"):
        return value >= float(text[:-1])
    return math.isclose(value, float(text))


def _fits(offering: Offering, r: Resources, use_spot: bool) -> bool:
    if r.cloud not in (None, offering.cloud):
        return False
    if r.region not in (None, offering.region) or r.zone not in (None, offering.zone):
        return False
    if offering.hourly(use_spot) is None:
        return False
    if r.instance_type is not None and offering.instance_type != r.instance_type:
        return False
    if r.accelerators:
        ((name, count),) = r.accelerators.items()
        if offering.accelerator is None or offering.accelerator.lower() != name.lower():
            return False
        if offering.accelerator_count != max(1, math.ceil(float(count))):
            return False
    elif r.instance_type is None:
        if offering.accelerator is not None:
            return False
        if not offering.instance_type.startswith(DEFAULT_CPU_FAMILIES[offering.cloud]):
            return False
    cpus, memory = r.cpus, r.memory
    if r.accelerators is None and r.instance_type is None and cpus is None and memory is None:
        cpus = DEFAULT_CPUS
        memory = f"{float(DEFAULT_CPUS.rstrip('+')) * DEFAULT_MEMORY_PER_CPU:g}+"
    return _matches_count(cpus, offering.vcpus) and _matches_count(memory, offering.memory_gib)


def best_tier_refusal(cloud: str, instance_type: str) -> str | None:
    """Why `instance_type` cannot honour `network_tier: best` on `cloud` (None: it can)."""
    if cloud == "aws":
        return efa.best_tier_refusal(instance_type)
    if cloud == "gcp":
        return fabric.best_tier_refusal(instance_type)
    return None


def catalog_clouds(resources: Resources) -> list[str]:
    """The catalog clouds any candidate may run on (all of them when none names a cloud)."""
    clouds = {r.cloud for r in resources.candidates()}
    if None in clouds:
        return list(catalog.CATALOG_CLOUDS)
    return [c for c in catalog.CATALOG_CLOUDS if c in clouds]


def plan(resources: Resources, num_nodes: int, clouds: Sequence[str] | None = None) -> list[Choice]:
    """Every fitting offering, best first: cheapest first (an `ordered` list: earlier alternatives first).

    Raises SpecError naming the closest candidates when nothing fits.
    """
    use_spot = bool(resources.use_spot)
    candidates = resources.candidates()
    clouds = list(clouds) if clouds is not None else catalog_clouds(resources)
    choices: list[Choice] = []
    refused: dict[str, str] = {}  # instance type -> why it cannot honour `network_tier: best`
    for cloud in clouds:
        for offering in catalog.offerings(cloud):
            for index, candidate in enumerate(candidates):
                spot = bool(candidate.use_spot) if candidate.use_spot is not None else use_spot
                if not _fits(offering, candidate, spot):
                    continue
                refusal = (
                    best_tier_refusal(cloud, offering.instance_type)
                    if candidate.network_tier == "best"
                    else None
                )
                if refusal is not None:
                    refused.setdefault(offering.instance_type, refusal)
                    continue
                choices.append(Choice(offering, spot, num_nodes, index))
                break
    if not choices and refused:
        reasons = "; ".join(list(refused.values())[:4])
        raise SpecError(f"resources.network_tier: best: no instance that fits can honour it: {reasons}")
    if not choices:
        raise SpecError(_no_fit_message(candidates, clouds, num_nodes))
    ordered = bool(resources.ordered) or resources.accelerators_ordered
    choices.sort(key=lambda c: ((c.candidate if ordered else 0), c.cost, c.offering.cloud, c.offering.zone))
    return choices


def network_note(choice: Choice, resources: Resources) -> str | None:
    """What `--dryrun` says of the chosen type's fast network under `network_tier: best`."""
    if resources.network_tier != "best":
        return None
    o = choice.offering
    if o.cloud == "aws":
        found = efa.efa_of(o.instance_type)
        return (
            f"network_tier: best: {o.instance_type} with {found.max_interfaces if found else 0} EFA "
            "interface(s), all nodes in one cluster placement group; NCCL over EFA in every rank's env"
        )
    if o.cloud == "gcp":
        fast = fabric.fabric_of(o.instance_type)
        return f"network_tier: best: {o.instance_type} with {fast.label}" if fast else None
    return None


def best_per_instance_type(choices: Iterable[Choice]) -> list[Choice]:
    """The cheapest zone of each (cloud, instance type), keeping the plan's order."""
    seen: set[tuple[str, str, bool]] = set()
    result = []
    for choice in choices:
        key = (choice.offering.cloud, choice.offering.instance_type, choice.use_spot)
        if key not in seen:
            seen.add(key)
            result.append(choice)
    return result


def _no_fit_message(candidates: Sequence[Resources], clouds: Sequence[str], num_nodes: int) -> str:
    asked = "; ".join(_describe(r) for r in candidates)
    near = _closest(candidates, clouds)
    hint = f"; closest in the catalog: {', '.join(near)}" if near else ""
    return f"resources: no instance in the {'/'.join(clouds) or 'catalog'} catalog fits {asked}{hint}"


def _describe(r: Resources) -> str:
    parts = []
    if r.accelerators:
        ((name, count),) = r.accelerators.items()
        parts.append(
            f"accelerators {name}:{count:g}" if isinstance(count, float) else f"accelerators {name}:{count}"
        )
    for field in ("cpus", "memory", "instance_type", "cloud", "region", "zone"):
        value = getattr(r, field)
        if value is not None:
            parts.append(f"{field} {value}")
    if r.use_spot:
        parts.append("spot")
    return ", ".join(parts) or "the default (8+ vCPUs)"


def _closest(candidates: Sequence[Resources], clouds: Sequence[str]) -> list[str]:
    """Offerings of the asked accelerator (any count, any place) or else of the asked instance type."""
    names: list[str] = []
    for r in candidates:
        for cloud in clouds:
            for o in catalog.offerings(cloud):
                same_gpu = (
                    r.accelerators
                    and o.accelerator
                    and o.accelerator.lower() in {n.lower() for n in r.accelerators}
                )
                same_type = r.instance_type and o.instance_type.split(".")[0] == r.instance_type.split(".")[0]
                if same_gpu or same_type:
                    label = (
                        f"{o.instance_type} ({o.accelerator}:{o.accelerator_count})"
                        if o.accelerator
                        else o.instance_type
                    )
                    if f"{cloud}:{label}" not in names:
                        names.append(f"{cloud}:{label}")
    return [n.split(":", 1)[1] if len(clouds) == 1 else n for n in names[:6]]
