"""EFA (Elastic Fabric Adapter) on the catalog's GPU types: what `network_tier: best` asks of a launch (pure).

The table is AWS's published `MaximumEfaInterfaces` (DescribeInstanceTypes, NetworkInfo.EfaInfo; the same
figures SkyPilot reads at launch) for every GPU type in the catalog that has EFA; a type not listed has none.
`rdma`: the type does GPUDirect RDMA over EFA (Nitro v4 and later: p4d/p4de, p5 family), so libfabric is
told to use the device's RDMA (FI_EFA_USE_DEVICE_RDMA=1); on the others EFA still bypasses the kernel.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class EfaType:
    max_interfaces: int
    rdma: bool = False


EFA_TYPES: dict[str, EfaType] = {
    # A100 / H100 / H200: one EFA per network card.
    "p4d.24xlarge": EfaType(4, rdma=True),
    "p4de.24xlarge": EfaType(4, rdma=True),
    "p5.48xlarge": EfaType(32, rdma=True),
    "p5e.48xlarge": EfaType(32, rdma=True),
    "p5en.48xlarge": EfaType(16, rdma=True),
    # V100-32GB
    "p3dn.24xlarge": EfaType(1),
    # L40S
    "g6e.8xlarge": EfaType(1),
    "g6e.12xlarge": EfaType(1),
    "g6e.16xlarge": EfaType(1),
    "g6e.24xlarge": EfaType(2),
    "g6e.48xlarge": EfaType(4),
    # A10G
    "g5.8xlarge": EfaType(1),
    "g5.12xlarge": EfaType(1),
    "g5.16xlarge": EfaType(1),
    "g5.24xlarge": EfaType(1),
    "g5.48xlarge": EfaType(1),
    # L4
    "g6.8xlarge": EfaType(1),
    "g6.12xlarge": EfaType(1),
    "g6.16xlarge": EfaType(1),
    "g6.24xlarge": EfaType(1),
    "g6.48xlarge": EfaType(1),
    "gr6.8xlarge": EfaType(1),
    # T4
    "g4dn.8xlarge": EfaType(1),
    "g4dn.12xlarge": EfaType(1),
    "g4dn.16xlarge": EfaType(1),
    "g4dn.metal": EfaType(1),
}

# P5 and P5e: AWS's layout for full bandwidth puts an EFA-with-ENA interface on every fourth card, EFA-only
# interfaces on the others (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html).
_ENA_EVERY_FOURTH = frozenset({"p5.48xlarge", "p5e.48xlarge"})


def efa_of(instance_type: str) -> EfaType | None:
    return EFA_TYPES.get(instance_type)


def best_tier_refusal(instance_type: str) -> str | None:
    """None when the type can honour `network_tier: best`; else why not (for `--dryrun` and the error)."""
    if efa_of(instance_type) is not None:
        return None
    families = sorted({t.split(".")[0] for t in EFA_TYPES})
    return (
        f"aws {instance_type}: has no EFA (Elastic Fabric Adapter), so `network_tier: best` cannot give "
        f"its nodes a fast interconnect; GPU families with EFA (larger sizes): {', '.join(families)}"
    )


def interface_count(instance_type: str, public_ip: bool) -> int:
    """EFA interfaces a launch gets: all the type has, or one when the nodes take a public address (EC2
    refuses a public address on a launch with more than one interface; SkyPilot does the same)."""
    found = efa_of(instance_type)
    if found is None:
        return 0
    return 1 if public_ip else found.max_interfaces


def network_interfaces(
    instance_type: str, subnet: str, groups: list[str], efa_groups: list[str], public_ip: bool
) -> list[dict[str, Any]]:
    """run_instances' NetworkInterfaces for `network_tier: best`: the primary interface (card 0, device 0)
    an EFA with ENA in `groups`; one more per further network card (device 1), EFA-only but on P5/P5e's
    every fourth card, in `efa_groups` (the group that lets EFA traffic through)."""
    primary = {
        "DeviceIndex": 0,
        "NetworkCardIndex": 0,
        "SubnetId": subnet,
        "Groups": groups,
        "AssociatePublicIpAddress": public_ip,
        "InterfaceType": "efa",
    }
    interfaces = [primary]
    for card in range(1, interface_count(instance_type, public_ip)):
        kind = "efa" if instance_type in _ENA_EVERY_FOURTH and card % 4 == 0 else "efa-only"
        interfaces.append(
            {
                "DeviceIndex": 1,
                "NetworkCardIndex": card,
                "SubnetId": subnet,
                "Groups": efa_groups,
                "InterfaceType": kind,
            }
        )
    return interfaces


def nccl_env(instance_type: str) -> dict[str, str]:
    """The env NCCL (through the aws-ofi-nccl plugin of AWS's deep-learning images) needs to run over EFA."""
    found = efa_of(instance_type)
    if found is None:
        return {}
    env = {
        "FI_PROVIDER": "efa",  # libfabric: EFA, never its TCP fallback
        "FI_EFA_FORK_SAFE": "1",  # data-loader workers fork after EFA memory is registered
        "NCCL_SOCKET_IFNAME": "^lo,docker",  # NCCL's bootstrap over the ENA interface, not loopback
    }
    if found.rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env
