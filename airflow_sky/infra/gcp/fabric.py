"""What fast networking a GCE machine type has, and whether it can honour `network_tier: best` (pure).

`best` on gcp means, as in SkyPilot and dstack: the cluster's VMs in one compact placement policy, gVNIC on
their NICs, and where the type has them, its GPU NICs on extra VPC networks (GPUDirect-TCPX on A3 High and
A3 Edge, GPUDirect-TCPXO on A3 Mega, GPUDirect-RDMA over RoCE on A3 Ultra and A4) with the NCCL env that
uses them. Compact placement is offered on the accelerator-optimized families (A2, A3, A4, G2, G4) and the
compute-optimized and N2 families; a type outside them (N1, E2, ...) cannot be placed close together, so
`best` is refused on it with the reason rather than running silently slow.
"""

from __future__ import annotations

import dataclasses

# Families GCE places with a compact (COLLOCATED) placement policy.
_COMPACT_FAMILIES = frozenset(
    {
        "a2",
        "a3",
        "a4",
        "a4x",
        "g2",
        "g4",
        "c2",
        "c2d",
        "c3",
        "c3d",
        "c4",
        "c4a",
        "c4d",
        "h3",
        "n2",
        "n2d",
        "z3",
    }
)

GPUDIRECT_TCPX = "gpudirect-tcpx"
GPUDIRECT_TCPXO = "gpudirect-tcpxo"
GPUDIRECT_RDMA = "gpudirect-rdma"

# NCCL over GPUDirect-TCPX (a3-highgpu-8g, a3-edgegpu-8g), as SkyPilot sets it: the four GPU NICs are
# eth1..eth4 (the control NIC eth0), and the TCPX plugin lives under /usr/local/tcpx.
TCPX_NCCL_ENV = {
    "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": "eth1,eth2,eth3,eth4",
    "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
    "NCCL_GPUDIRECTTCPX_TX_BINDINGS": (
        "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177"
    ),
    "NCCL_GPUDIRECTTCPX_RX_BINDINGS": (
        "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191"
    ),
    "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "50000",
    "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": "/run/tcpx",
    "NCCL_GPUDIRECTTCPX_FORCE_ACK": "0",
    "NCCL_SOCKET_IFNAME": "eth0",
}
# NCCL over GPUDirect-TCPXO (a3-megagpu-8g), as Google's cluster toolkit and dstack's A3 Mega example set it
# on Google's images: the control NIC enp0s12, the eight GPU NICs, the FasTrak plugin's own settings.
TCPXO_NCCL_ENV = {
    "NCCL_FASTRAK_CTRL_DEV": "enp0s12",
    "NCCL_FASTRAK_IFNAME": "enp6s0,enp7s0,enp13s0,enp14s0,enp134s0,enp135s0,enp141s0,enp142s0",
    "NCCL_SOCKET_IFNAME": "enp0s12",
    "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
    "NCCL_FASTRAK_USE_LLCM": "1",
    "NCCL_FASTRAK_USE_SNAP": "1",
    "NCCL_FASTRAK_NUM_FLOWS": "2",
    "NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL": "0",
    "NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS": "600000",
    "NCCL_CROSS_NIC": "0",
    "NCCL_NET_GDR_LEVEL": "PIX",
    "NCCL_NVLS_ENABLE": "0",
}


@dataclasses.dataclass(frozen=True)
class Fabric:
    """A machine type's fast networking under `network_tier: best`."""

    kind: str | None  # GPUDIRECT_*; None: compact placement and gVNIC only
    extra_nics: int  # GPU NICs beyond the first, each on its own VPC network
    nccl_env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.kind is None:
            return "compact placement + gVNIC"
        return f"compact placement + gVNIC + {self.kind} ({self.extra_nics} GPU NICs)"


# Types with GPU NICs of their own (GCE docs: A3 High 8g and A3 Edge 4x200 Gbps, A3 Mega 8x200 Gbps,
# A3 Ultra and A4 8x400 Gbps CX-7 RoCE). Smaller A3 High types have no GPUDirect NICs.
_GPU_NICS = {
    "a3-highgpu-8g": Fabric(GPUDIRECT_TCPX, 4, TCPX_NCCL_ENV),
    "a3-edgegpu-8g": Fabric(GPUDIRECT_TCPX, 4, TCPX_NCCL_ENV),
    "a3-megagpu-8g": Fabric(GPUDIRECT_TCPXO, 8, TCPXO_NCCL_ENV),
    "a3-ultragpu-8g": Fabric(GPUDIRECT_RDMA, 8),
    "a4-highgpu-8g": Fabric(GPUDIRECT_RDMA, 8),
}


def family(machine_type: str) -> str:
    return machine_type.split("-", 1)[0].lower()


def fabric_of(machine_type: str) -> Fabric | None:
    """The type's fast networking; None when it cannot be placed compactly (so `best` is refused)."""
    base = machine_type.lower().removesuffix("-nolssd").removesuffix("-lssd")
    if base in _GPU_NICS:
        return _GPU_NICS[base]
    if family(machine_type) in _COMPACT_FAMILIES:
        return Fabric(None, 0)
    return None


def best_tier_refusal(machine_type: str) -> str | None:
    """None when the type can honour `network_tier: best`; else why not (for `--dryrun` and the error)."""
    if fabric_of(machine_type) is not None:
        return None
    return (
        f"gcp {machine_type}: the {family(machine_type).upper()} family has no compact placement, so "
        "`network_tier: best` cannot keep the nodes close; families that can: "
        + ", ".join(sorted(f.upper() for f in _COMPACT_FAMILIES))
    )
