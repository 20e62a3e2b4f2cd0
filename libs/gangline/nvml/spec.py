"""The stand-in's node spec: a YAML file describing one GPU node as NVML would see it.

``gpu_defaults`` is merged under every entry of ``gpus`` so an 8-GPU node stays short. Built-in specs
live in ``gangline/nvml/specs/*.yaml`` and load by name with :func:`load_builtin_spec`.
"""

from __future__ import annotations

import uuid
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, model_validator

_UUID_NAMESPACE = uuid.UUID("6f1c3a52-9f4e-4c47-9d2a-5e0d3b1c7a10")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MigDeviceSpec(_Spec):
    """One MIG device: a compute instance of a GPU instance. Several may share a GPU instance."""

    profile: str
    """NVIDIA's profile name, e.g. ``1g.10gb``, ``3g.40gb``."""
    memory_mib: int
    gpu_instance_id: int
    """The id the driver gave the GPU instance; it is not where the instance sits."""
    placement_start: int
    """The first memory slice the GPU instance occupies (``nvmlGpuInstanceGetInfo`` placement)."""
    placement_size: int
    """How many memory slices it occupies."""
    compute_instance_id: int = 0


class GpuSpec(_Spec):
    name: str
    memory_mib: int
    pci_bus_id: str
    uuid: str | None = None
    """Generated deterministically from node and bus id when absent."""
    numa_node: int = 0
    pcie_switch: str | None = None
    pcie_root: str | None = None
    nvlink_to: Literal["none", "nvswitch", "peers"] = "none"
    nvlinks: int = 0
    """Links to NVSwitches (spread round-robin over the node's switches) when ``nvlink_to: nvswitch``."""
    nvlink_peers: tuple[int, ...] = ()
    """GPU indices this GPU links to directly when ``nvlink_to: peers``, ``links_per_peer`` links each."""
    links_per_peer: int = 1
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceSpec, ...] = ()
    ecc: bool = True
    row_remapping: bool = False
    """Ampere and later remap rows; Volta and older retire pages instead."""
    page_retirement: bool = False
    temperature_c: int = 35
    throttle_reasons: int = 0
    supported_events: tuple[Literal["xid", "double_bit_ecc", "single_bit_ecc"], ...] = (
        "xid",
        "double_bit_ecc",
        "single_bit_ecc",
    )


class NodeSpec(_Spec):
    node: str
    driver_version: str
    nvswitches: tuple[str, ...] = ()
    gpus: tuple[GpuSpec, ...]

    @model_validator(mode="before")
    @classmethod
    def _merge_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and "gpu_defaults" in data:
            data = dict(data)
            defaults = data.pop("gpu_defaults") or {}
            data["gpus"] = [{**defaults, **g} for g in data.get("gpus", [])]
        return data

    @model_validator(mode="after")
    def _check_links(self) -> NodeSpec:
        for i, g in enumerate(self.gpus):
            if g.nvlink_to == "nvswitch" and not self.nvswitches:
                raise ValueError(f"gpu {i} links to NVSwitches but the node lists none")
            for p in g.nvlink_peers:
                if not 0 <= p < len(self.gpus) or p == i:
                    raise ValueError(f"gpu {i} has an NVLink peer {p} that is not another GPU of the node")
            if g.mig_enabled and not g.mig_capable:
                raise ValueError(f"gpu {i} has MIG enabled but is not MIG-capable")
        return self

    def gpu_uuid(self, index: int) -> str:
        g = self.gpus[index]
        return g.uuid or f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{self.node}/{g.pci_bus_id}')}"

    def mig_uuid(self, index: int, mig_index: int) -> str:
        return f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{self.gpu_uuid(index)}/mig{mig_index}')}"


def load_spec(path: Path) -> NodeSpec:
    return parse_spec(path.read_text(encoding="utf-8"))


def parse_spec(text: str) -> NodeSpec:
    return NodeSpec.model_validate(yaml.safe_load(text))


def builtin_spec_names() -> list[str]:
    folder = resources.files("gangline.nvml") / "specs"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_builtin_spec(name: str, *, node: str | None = None) -> NodeSpec:
    """A packaged spec by file stem (``dgx-h100``); ``node`` renames it so one spec serves many nodes."""
    text = (resources.files("gangline.nvml") / "specs" / f"{name}.yaml").read_text(encoding="utf-8")
    spec = parse_spec(text)
    return spec if node is None else spec.model_copy(update={"node": node})
