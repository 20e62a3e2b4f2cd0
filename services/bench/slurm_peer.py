"""A single-host Slurm 22.05 (Debian 12 packages) on the nodes of a Gangline cluster spec, for benchmarks.

After the tested recipe in ``../shared/slurm-peer/`` (RECIPE.md: one real ``slurmd -N <node>`` per fake
node on 127.0.0.1, fake GPU gres on placeholder char devices, slurmdbd on a private MariaDB for fair
share, topology/tree, backfill with ``batch_sched_delay=0`` and ``bf_resolution=10``, partition
preemption with REQUEUE). Everything lives in one scratch folder, every daemon listens on 127.0.0.1, and
:meth:`SlurmPeer.stop` ends what :meth:`SlurmPeer.start` started (by PID file) and removes the folder.

The configuration files are pure functions of the spec (:func:`slurm_conf`, :func:`gres_conf`,
:func:`topology_conf`, :func:`slurmdbd_conf`, :func:`my_cnf`): Slurm's nodes are the spec's node ids and
its leaf switches the spec's leaf labels, so both schedulers see one cluster.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gangline.cluster_spec import ClusterSpec

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
CTLD_PORT, SLURMD_PORT, DBD_PORT, MYSQL_PORT, NODE_PORT_BASE = 16817, 16818, 16819, 13306, 17001
ACCOUNTS = {"a1": 40, "a2": 30, "a3": 20, "a4": 10}
"""The fair-share accounts of the recipe's mixed workload and their shares."""
DB_PASSWORD = "slurmpeer"
MUNGE_PID = Path("/run/munge/munged.pid")


def _check_whole_gpus(spec: ClusterSpec) -> int:
    """GPUs per node: Slurm's gres here is one count per node, so every group must have the same."""
    counts = {g.gpus_per_node for g in spec.groups}
    if len(counts) != 1 or any(g.mode != "whole" for g in spec.groups):
        raise ValueError("the Slurm peer needs whole GPUs and the same GPU count on every node")
    return counts.pop()


def slurm_conf(spec: ClusterSpec, root: Path, host: str) -> str:
    """slurm.conf for the spec's nodes (RECIPE.md section 4; one NodeName line per node, its own port)."""
    gpus = _check_whole_gpus(spec)
    nodes = [r.node for r in spec.registrations()]
    lines = [
        f"# Slurm peer of Gangline cluster {spec.name}: {len(nodes)} nodes x {gpus} GPUs (generated)",
        "ClusterName=peer",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
        f"StateSaveLocation={root}/var/ctld",
        f"SlurmdSpoolDir={root}/var/d/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "MaxJobCount=200000",
        "MaxArraySize=100001",
        "MinJobAge=300",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=bf_interval=5,bf_continue,bf_max_job_test=2000,default_queue_depth=500,"
        "batch_sched_delay=0,bf_resolution=10",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=1000",
        "GresTypes=gpu",
        "TopologyPlugin=topology/tree",
        "PriorityType=priority/multifactor",
        "PriorityDecayHalfLife=1-0",
        "PriorityCalcPeriod=1",
        "PriorityWeightFairshare=100000",
        "PriorityWeightAge=1000",
        "PriorityWeightPartition=10000",
        "PriorityWeightQOS=10000",
        "PriorityWeightJobSize=0",
        "PriorityMaxAge=1-0",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={DBD_PORT}",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits,qos",
        "JobCompType=jobcomp/none",
    ]
    lines += [
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={NODE_PORT_BASE + k} CPUs=64 Sockets=2 "
        f"CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000000 Gres=gpu:{gpus} State=UNKNOWN"
        for k, node in enumerate(nodes)
    ]
    lines += [
        "PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        "PreemptMode=REQUEUE TRESBillingWeights=CPU=0,Mem=0,GRES/gpu=1",
        "PartitionName=high Nodes=ALL Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF "
        "TRESBillingWeights=CPU=0,Mem=0,GRES/gpu=1",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(spec: ClusterSpec, root: Path) -> str:
    """gres.conf: every node's GPUs are placeholder devices ``<root>/dev/nvidia<k>`` (RECIPE.md pitfall 2)."""
    gpus = _check_whole_gpus(spec)
    nodes = ",".join(r.node for r in spec.registrations())
    files = f"{root}/dev/nvidia[0-{gpus - 1}]" if gpus > 1 else f"{root}/dev/nvidia0"
    return f"AutoDetect=off\nNodeName={nodes} Name=gpu File={files}\n"


def topology_conf(spec: ClusterSpec) -> str:
    """topology.conf: one switch per leaf label with its nodes, one per spine over its leaves, and a root
    over the spines when there are several (topology/tree needs one tree to place across them)."""
    leaves: dict[str, list[str]] = {}
    spines: dict[str, list[str]] = {}
    for r in spec.registrations():
        leaves.setdefault(r.leaf, []).append(r.node)
        if r.leaf not in spines.setdefault(r.spine, []):
            spines[r.spine].append(r.leaf)
    lines = [f"SwitchName={leaf} Nodes={','.join(nodes)}" for leaf, nodes in leaves.items()]
    lines += [f"SwitchName={spine} Switches={','.join(ls)}" for spine, ls in spines.items()]
    if len(spines) > 1:
        lines.append(f"SwitchName=root Switches={','.join(spines)}")
    return "\n".join(lines) + "\n"


def slurmdbd_conf(root: Path, host: str) -> str:
    return (
        f"AuthType=auth/munge\nDbdHost={host}\nDbdAddr=127.0.0.1\nDbdPort={DBD_PORT}\n"
        "CommunicationParameters=NoInAddrAny\nSlurmUser=root\nDebugLevel=info\n"
        f"LogFile={root}/log/slurmdbd.log\nPidFile={root}/run/slurmdbd.pid\n"
        f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={MYSQL_PORT}\n"
        f"StorageUser=slurm\nStoragePass={DB_PASSWORD}\nStorageLoc=slurm_acct_db\n"
    )


def my_cnf(root: Path) -> str:
    return (
        f"[mysqld]\ndatadir={root}/mysql\nsocket={root}/run/mysqld.sock\npid-file={root}/run/mysqld.pid\n"
        f"bind-address=127.0.0.1\nport={MYSQL_PORT}\nuser=root\nlog-error={root}/log/mysqld.err\n"
        "innodb_buffer_pool_size=256M\ninnodb_lock_wait_timeout=900\ninnodb_log_file_size=64M\n"
        "innodb_flush_log_at_trx_commit=2\nskip-name-resolve\n"
    )


def ensure_packages(log: Path) -> None:
    """apt-get install the recipe's packages unless all are installed (idempotent)."""
    if subprocess.run(["dpkg", "-s", *PACKAGES], capture_output=True).returncode == 0:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with log.open("ab") as out:
        subprocess.run(["apt-get", "update"], check=True, stdout=out, stderr=subprocess.STDOUT, env=env)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
            check=True,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _alive(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class SlurmPeer:
    """The Slurm peer of ``spec`` in a fresh scratch folder ``root`` (removed by :meth:`stop`)."""

    spec: ClusterSpec
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    started_munge: bool = False
    mariadb: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment every client command needs (RECIPE.md pitfall 6)."""
        return {**os.environ, "SLURM_CONF": str(self.root / "etc" / "slurm.conf")}

    @property
    def nodes(self) -> list[str]:
        return [r.node for r in self.spec.registrations()]

    def run(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(list(args), env=self.env, capture_output=True, text=True)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def write_config(self) -> None:
        r = self.root
        for sub in ("etc", "log", "run", "var/ctld", "var/d", "mysql", "dev"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "etc" / "slurm.conf").write_text(slurm_conf(self.spec, r, self.host))
        (r / "etc" / "gres.conf").write_text(gres_conf(self.spec, r))
        (r / "etc" / "topology.conf").write_text(topology_conf(self.spec))
        (r / "etc" / "my.cnf").write_text(my_cnf(r))
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(slurmdbd_conf(r, self.host))
        dbd.chmod(0o600)
        for k in range(_check_whole_gpus(self.spec)):
            dev = r / "dev" / f"nvidia{k}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a /dev/null clone (pitfall 2)

    def start(self) -> None:
        """Configure; start munged (unless running), MariaDB, slurmdbd, slurmctld and one slurmd per node."""
        resolved = socket.gethostbyname(self.host)
        if not resolved.startswith("127."):
            raise RuntimeError(
                f"hostname {self.host} resolves to {resolved}, not 127.x (RECIPE.md pitfall 4)"
            )
        ports = (
            CTLD_PORT,
            SLURMD_PORT,
            DBD_PORT,
            MYSQL_PORT,
            *(NODE_PORT_BASE + k for k in range(len(self.nodes))),
        )
        taken = [p for p in ports if _port_taken(p)]
        if taken:
            raise RuntimeError(f"ports {taken} on 127.0.0.1 are in use: is another Slurm peer running?")
        self.write_config()
        r = self.root
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        if _alive(MUNGE_PID) is None:
            MUNGE_PID.parent.mkdir(parents=True, exist_ok=True)
            shutil.chown(MUNGE_PID.parent, "munge", "munge")
            subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
            self.started_munge = True
        cnf = f"--defaults-file={r}/etc/my.cnf"
        with (r / "log" / "mysql-install.log").open("ab") as out:
            subprocess.run(
                ["mariadb-install-db", cnf, "--auth-root-authentication-method=normal"],
                check=True,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        with (r / "log" / "mysqld.out").open("ab") as out:
            self.mariadb = subprocess.Popen(
                ["/usr/sbin/mariadbd", cnf], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        sql = ["mariadb", f"--socket={r}/run/mysqld.sock", "-uroot"]
        self._until(lambda: subprocess.run([*sql, "-e", "select 1"], capture_output=True).returncode == 0, 30)
        grant = (
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
            "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; "
            "FLUSH PRIVILEGES;"
        )
        subprocess.run([*sql, "-e", grant], check=True, capture_output=True)
        self.run("/usr/sbin/slurmdbd")
        self._until(lambda: _port_taken(DBD_PORT), 30)
        self._accounts()
        self.run("/usr/sbin/slurmctld")  # never slurmctld-wlm (pitfall 1)
        self._until(lambda: "UP" in self.run("scontrol", "ping", check=False), 30)
        for node in self.nodes:
            (r / "var" / "d" / node).mkdir(parents=True, exist_ok=True)
            self.run("/usr/sbin/slurmd", "-N", node)
        self._until(lambda: self.idle_nodes() == len(self.nodes), 60)

    def _accounts(self) -> None:
        def mgr(*args: str) -> None:
            self.run("sacctmgr", "-i", *args, check=False)

        mgr("add", "cluster", "peer")
        mgr("add", "account", ",".join(ACCOUNTS), "cluster=peer", "Description=bench", "Organization=bench")
        for account, share in ACCOUNTS.items():
            mgr("modify", "account", account, "set", f"fairshare={share}")
        mgr("add", "user", "root", f"account={','.join(ACCOUNTS)}", "cluster=peer")
        mgr("modify", "user", "root", "set", "defaultaccount=a1")

    def idle_nodes(self) -> int:
        out = self.run("sinfo", "-h", "-p", "low", "-t", "idle", "-o", "%D", check=False).strip()
        return int(out) if out.isdigit() else 0

    def queued(self) -> int:
        """Jobs (array tasks each) still pending or running."""
        return len(self.run("squeue", "-h", "-r", "-o", "%i").split())

    def sbatch(self, args: Iterable[str], wrap: str) -> int:
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", wrap)
        return int(out.strip().split(";")[0])

    def cancel_all(self, timeout_s: float = 120) -> None:
        """scancel every job; wait until none is left (a cancelled job's step takes seconds to end)."""
        self.run("scancel", "--user=root", check=False)
        self._until(lambda: self.queued() == 0, timeout_s)

    @staticmethod
    def _until(ready: object, timeout_s: float) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError("the Slurm peer did not get ready in time")
            time.sleep(0.2)

    def pids(self) -> list[tuple[str, int]]:
        """The daemons this peer started that are alive, by PID file (slurmd first, MariaDB last)."""
        run = self.root / "run"
        files = [*sorted(run.glob("slurmd-*.pid")), run / "slurmctld.pid", run / "slurmdbd.pid"]
        alive = [(f.name, pid) for f in files if (pid := _alive(f)) is not None]
        if self.mariadb is not None and self.mariadb.poll() is None:
            alive.append(("mariadbd", self.mariadb.pid))
        return alive

    def stop(self) -> list[str]:
        """Cancel every job and wait for the queue to empty; SIGTERM to every daemon started (by PID file)
        and to the job steps their slurmds left, SIGKILL after 20 s; munged if it was started here; the
        scratch folder removed. Returns what had to be killed."""
        killed: list[str] = []
        if _alive(self.root / "run" / "slurmctld.pid"):
            with contextlib.suppress(TimeoutError, RuntimeError):
                self.cancel_all()
        slurmds = [pid for name, pid in self.pids() if name.startswith("slurmd-")]
        steps = [("slurmstepd", pid) for pid in _descendants(slurmds)]
        for daemon in ("slurmd", "slurmstepd", "slurmctld", "slurmdbd", "mariadbd"):
            if daemon == "slurmstepd":
                group = [(n, p) for n, p in steps if _pid_alive(p)]
            else:
                group = [(n, p) for n, p in self.pids() if n.split("-")[0].split(".")[0] == daemon]
            for _, pid in group:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while any(_pid_alive(p) for _, p in group) and time.monotonic() < deadline:
                time.sleep(0.2)
            for name, pid in group:
                if _pid_alive(pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    killed.append(name)
        if self.mariadb is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.mariadb.wait(timeout=10)
        munged = _alive(MUNGE_PID) if self.started_munge else None
        if munged is not None:
            os.kill(munged, signal.SIGTERM)
        shutil.rmtree(self.root, ignore_errors=True)
        return killed


def _descendants(roots: list[int]) -> list[int]:
    """Every live process below ``roots`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child of ours (MariaDB) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
