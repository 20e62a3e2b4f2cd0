"""The worker environment contract: torch.distributed's env:// variables plus Gangline's own.

Each rank gets ``CUDA_VISIBLE_DEVICES`` (its GPU UUIDs, or MIG UUIDs), ``MASTER_ADDR``/``MASTER_PORT``
(rank 0's node), ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``
(the node's index in the gang) exactly as ``torch.distributed.init_process_group("env://")`` and
torchrun-style programs read them, and:

- ``GANGLINE_JOB_ID``         the job
- ``GANGLINE_ATTEMPT``        0 for the first launch, +1 per gang restart (like TORCHELASTIC_RESTART_COUNT)
- ``GANGLINE_CHECKPOINT_DIR`` where to write checkpoints and read them back on resume; the same on requeue
- ``GANGLINE_CHECKPOINT_ACK`` a file the rank creates once its checkpoint is durable (its directory exists
  when the rank starts); the agent reports the checkpoint acknowledged when every rank created its file
  before the grace deadline
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

ENV_JOB_ID = "GANGLINE_JOB_ID"
ENV_ATTEMPT = "GANGLINE_ATTEMPT"
ENV_CHECKPOINT_DIR = "GANGLINE_CHECKPOINT_DIR"
ENV_CHECKPOINT_ACK = "GANGLINE_CHECKPOINT_ACK"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RankSpec(_Frozen):
    """One worker placed on this node."""

    rank: int
    local_rank: int
    gpus: tuple[str, ...]
    """GPU ids for CUDA_VISIBLE_DEVICES: UUIDs (``GPU-...``/``MIG-...``) or indices."""


class Rendezvous(_Frozen):
    master_addr: str
    master_port: int
    world_size: int
    group_rank: int = 0
    """This node's index among the gang's nodes (torchrun's GROUP_RANK / node rank)."""

    @field_validator("master_port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 < v < 65536:
            raise ValueError("master_port must be a TCP port")
        return v


class Placement(_Frozen):
    """One entry of ``allocation.granted.placements``."""

    rank: int
    node: str
    gpus: tuple[str, ...]


def layout_for_node(
    placements: Sequence[Placement],
    node: str,
    *,
    master_port: int,
    address_of: Callable[[str], str],
) -> tuple[tuple[RankSpec, ...], Rendezvous]:
    """This node's ranks and the rendezvous, from a gang's placements.

    The master is rank 0's node; ``address_of`` resolves a node name to an address its peers reach.
    Local ranks number this node's ranks in global-rank order; nodes are ranked by their lowest rank.
    """
    by_rank = sorted(placements, key=lambda p: p.rank)
    if [p.rank for p in by_rank] != list(range(len(by_rank))):
        raise ValueError("placements must cover ranks 0..W-1 exactly once")
    nodes = list(dict.fromkeys(p.node for p in by_rank))
    if node not in nodes:
        raise ValueError(f"no rank of this gang is placed on {node}")
    mine = [p for p in by_rank if p.node == node]
    ranks = tuple(RankSpec(rank=p.rank, local_rank=i, gpus=p.gpus) for i, p in enumerate(mine))
    rdzv = Rendezvous(
        master_addr=address_of(by_rank[0].node),
        master_port=master_port,
        world_size=len(by_rank),
        group_rank=nodes.index(node),
    )
    return ranks, rdzv


def checkpoint_dir_for(root: Path, job_id: str) -> Path:
    """The job's checkpoint directory: the same path every time the job is (re)started."""
    return root / _SAFE.sub("_", job_id)


def ack_file(checkpoint_dir: Path, rank: int) -> Path:
    return checkpoint_dir / ".gangline-ack" / f"rank-{rank}"


def rank_env(
    *,
    job_id: str,
    rank: RankSpec,
    rendezvous: Rendezvous,
    local_world_size: int,
    attempt: int,
    checkpoint_dir: Path,
    base: Mapping[str, str],
) -> dict[str, str]:
    """The full environment of one rank's process: ``base`` overlaid with the contract above."""
    env = dict(base)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(rank.gpus),
            "MASTER_ADDR": rendezvous.master_addr,
            "MASTER_PORT": str(rendezvous.master_port),
            "RANK": str(rank.rank),
            "WORLD_SIZE": str(rendezvous.world_size),
            "LOCAL_RANK": str(rank.local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "GROUP_RANK": str(rendezvous.group_rank),
            ENV_JOB_ID: job_id,
            ENV_ATTEMPT: str(attempt),
            ENV_CHECKPOINT_DIR: str(checkpoint_dir),
            ENV_CHECKPOINT_ACK: str(ack_file(checkpoint_dir, rank.rank)),
        }
    )
    return env
