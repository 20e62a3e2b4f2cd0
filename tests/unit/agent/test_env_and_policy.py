"""The worker environment contract and the restart policy (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gangline.agent.env import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_ACK,
    ENV_CHECKPOINT_DIR,
    Placement,
    RankSpec,
    Rendezvous,
    checkpoint_dir_for,
    layout_for_node,
    rank_env,
)
from gangline.agent.restart import GiveUp, Restart, RestartPolicy

ADDR = {"n0": "10.0.0.10", "n1": "10.0.0.11"}


def placements() -> list[Placement]:
    return [
        Placement(rank=2, node="n1", gpus=("GPU-c",)),
        Placement(rank=0, node="n0", gpus=("GPU-a",)),
        Placement(rank=3, node="n1", gpus=("GPU-d", "GPU-e")),
        Placement(rank=1, node="n0", gpus=("GPU-b",)),
    ]


def test_layout_gives_local_ranks_and_the_master_of_rank_zero() -> None:
    ranks, rdzv = layout_for_node(placements(), "n1", master_port=29500, address_of=ADDR.__getitem__)

    assert [(r.rank, r.local_rank, r.gpus) for r in ranks] == [(2, 0, ("GPU-c",)), (3, 1, ("GPU-d", "GPU-e"))]
    assert rdzv == Rendezvous(master_addr="10.0.0.10", master_port=29500, world_size=4, group_rank=1)


def test_layout_rejects_gaps_and_foreign_nodes() -> None:
    with pytest.raises(ValueError, match=r"0\.\.W-1"):
        layout_for_node(placements()[:3], "n0", master_port=1, address_of=ADDR.__getitem__)
    with pytest.raises(ValueError, match="n9"):
        layout_for_node(placements(), "n9", master_port=1, address_of=ADDR.__getitem__)
    with pytest.raises(ValueError, match="TCP port"):
        Rendezvous(master_addr="x", master_port=70000, world_size=1)


def test_rank_env_is_the_torch_env_contract_over_the_base() -> None:
    rdzv = Rendezvous(master_addr="10.0.0.10", master_port=29500, world_size=4, group_rank=1)
    env = rank_env(
        job_id="j/1",
        rank=RankSpec(rank=3, local_rank=1, gpus=("GPU-d", "GPU-e")),
        rendezvous=rdzv,
        local_world_size=2,
        attempt=2,
        checkpoint_dir=Path("/ckpt/j_1"),
        base={"PATH": "/bin", "RANK": "stale", "HF_HOME": "/hf"},
    )

    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")} == {
        "MASTER_ADDR": "10.0.0.10",
        "MASTER_PORT": "29500",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
    }
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["GROUP_RANK"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-d,GPU-e"
    assert env[ENV_ATTEMPT] == "2" and env[ENV_CHECKPOINT_DIR] == "/ckpt/j_1"
    assert env[ENV_CHECKPOINT_ACK] == "/ckpt/j_1/.gangline-ack/rank-3"
    assert env["PATH"] == "/bin" and env["HF_HOME"] == "/hf"


def test_checkpoint_dir_is_stable_and_safe() -> None:
    assert checkpoint_dir_for(Path("/c"), "team/a:job 1") == Path("/c/team_a_job_1")
    assert checkpoint_dir_for(Path("/c"), "team/a:job 1") == checkpoint_dir_for(Path("/c"), "team/a:job 1")


def test_on_failure_backs_off_exponentially_up_to_the_cap_then_gives_up() -> None:
    p = RestartPolicy(max_restarts=4, backoff_initial_s=1.0, backoff_factor=3.0, backoff_max_s=5.0)
    assert [p.decide(n) for n in (1, 2, 3, 4)] == [
        Restart(1, 1.0),
        Restart(2, 3.0),
        Restart(3, 5.0),
        Restart(4, 5.0),
    ]
    assert isinstance(p.decide(5), GiveUp) and "4 restarts" in p.decide(5).reason  # type: ignore[union-attr]


def test_never_gives_up_at_once_and_decide_needs_a_failure() -> None:
    assert isinstance(RestartPolicy(mode="never").decide(1), GiveUp)
    with pytest.raises(ValueError, match="after a failure"):
        RestartPolicy().decide(0)
