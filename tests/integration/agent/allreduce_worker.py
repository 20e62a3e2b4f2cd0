"""A stand-in for a torch.distributed training script, using exactly the env:// contract.

Rank 0 listens on MASTER_ADDR:MASTER_PORT, the other WORLD_SIZE-1 ranks connect (a rendezvous
with a barrier), and every step all-reduces (sums) ``rank + step`` over the ranks; the running
total is the "model". On SIGTERM the gang checkpoints at a step boundary into
GANGLINE_CHECKPOINT_DIR (rank 0 writes the state, every rank touches its GANGLINE_CHECKPOINT_ACK)
and exits 0; a relaunch with the same directory resumes from there. Standard library only.

usage: allreduce_worker.py OUT_DIR STEPS STEP_SLEEP_S
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, TextIO

RDZV_TIMEOUT_S = 90.0
PEER_LOSS_WAIT_S = 3.0

terminating = False


def on_sigterm(signum: int, frame: object) -> None:
    global terminating
    terminating = True


def send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


def recv(f: TextIO) -> Any:
    line = f.readline()
    if not line:
        raise ConnectionError("peer closed")
    return json.loads(line)


def rendezvous(rank: int, world: int, attempt: int, addr: str, port: int) -> Any:
    deadline = time.monotonic() + RDZV_TIMEOUT_S
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(world * 2)
        srv.settimeout(1.0)
        peers: dict[int, tuple[socket.socket, TextIO]] = {}
        while len(peers) < world - 1:
            if time.monotonic() > deadline:
                sys.exit(3)
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            f = conn.makefile("r")
            try:
                hello = recv(f)
            except (ConnectionError, ValueError):
                conn.close()
                continue
            if hello.get("attempt") != attempt or hello.get("world") != world:
                conn.close()  # a straggler from another attempt of the gang
                continue
            peers[int(hello["rank"])] = (conn, f)
        srv.close()
        for conn, _ in peers.values():
            send(conn, {"ok": True})
        return peers
    while True:
        if time.monotonic() > deadline:
            sys.exit(3)
        try:
            conn = socket.create_connection((addr, port), timeout=2.0)
            conn.settimeout(None)
            f = conn.makefile("r")
            send(conn, {"rank": rank, "attempt": attempt, "world": world})
            if recv(f).get("ok"):
                return conn, f
        except (OSError, ConnectionError, ValueError):
            pass
        time.sleep(0.1)


def main() -> int:
    out_dir, steps, step_sleep = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    signal.signal(signal.SIGTERM, on_sigterm)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["GANGLINE_ATTEMPT"])
    ckpt_dir = Path(os.environ["GANGLINE_CHECKPOINT_DIR"])
    ack = Path(os.environ["GANGLINE_CHECKPOINT_ACK"])
    state_file = ckpt_dir / "state.json"

    start, acc = 0, 0
    if state_file.exists():
        state = json.loads(state_file.read_text())
        start, acc = int(state["step"]), int(state["acc"])
    resumed_from = start

    def checkpoint(done_steps: int) -> int:
        if rank == 0:
            tmp = state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": done_steps, "acc": acc}))
            os.replace(tmp, state_file)
        ack.parent.mkdir(parents=True, exist_ok=True)
        ack.touch()
        print(f"rank {rank}: checkpointed at step {done_steps}", flush=True)
        return 0

    link = rendezvous(rank, world, attempt, os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    print(f"rank {rank}/{world} attempt {attempt} joined; resuming from step {start}", flush=True)
    step = start
    try:
        while step < steps:
            if terminating:
                return checkpoint(step)
            value = rank + step
            if rank == 0:
                total = value + sum(int(recv(f)["value"]) for _, f in link.values())
                for conn, _ in link.values():
                    send(conn, {"sum": total})
            else:
                conn, f = link
                send(conn, {"value": value})
                total = int(recv(f)["sum"])
            acc += total
            step += 1
            if step == start + 3:
                (out_dir / f"progress-a{attempt}-r{rank}").touch()
            time.sleep(step_sleep)
    except (OSError, ConnectionError, ValueError) as err:
        deadline = time.monotonic() + PEER_LOSS_WAIT_S
        while not terminating and time.monotonic() < deadline:
            time.sleep(0.05)  # a peer left: if we are being stopped, the signal is on its way
        if terminating:
            return checkpoint(step)
        print(f"rank {rank}: lost the gang at step {step}: {err!r}", flush=True)
        return 1
    result = {
        "rank": rank,
        "world_size": world,
        "attempt": attempt,
        "acc": acc,
        "resumed_from": resumed_from,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "group_rank": int(os.environ["GROUP_RANK"]),
        "cuda_visible_devices": os.environ["CUDA_VISIBLE_DEVICES"],
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
    }
    (out_dir / f"result-r{rank}.json").write_text(json.dumps(result))
    print(f"rank {rank}: done, acc={acc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
