"""A real Slurm cluster on this machine, on the SSH test hosts (root only; docs/FACTS.md).

``create_cluster(hosts, nodes)`` starts, on namespace hosts built by tests/e2e/sshhosts.py:

- one ``munged`` of this session as the ``munge`` user, on its own socket in the session's
  folder (so a munged or Slurm of another session is never touched); the key
  ``/etc/munge/munge.key`` is made once per machine (0400, owner munge);
- ``slurmctld -D`` in the root namespace, ``SlurmctldHost`` this machine's hostname (slurmctld
  refuses another) on the bridge address (never
  127.0.0.1: ``srun``'s callbacks would go there), on a port picked free;
- one ``slurmd -D -N NAME`` per compute host, entered into that host's namespaces (its
  hostname, network and files), with the host's own cgroup v1 mounts (``ip netns exec``
  hid /sys/fs/cgroup and slurmd refuses to start without it);
- ``slurm.conf`` in the session's folder, bind-mounted on ``/etc/slurm`` in every host (the
  login host included), so ``srun``/``squeue`` there find it as on a real cluster; the root
  namespace's commands get ``SLURM_CONF`` (:meth:`SlurmCluster.env`);
- with ``proctrack="cgroup"``, ``ProctrackType=proctrack/cgroup`` and a ``cgroup.conf``
  (cgroup/v1, nothing constrained) beside it: each slurmd (a multiple-slurmd build) keeps its
  steps in ``<hierarchy>/slurm_<node>/uid_U/job_J/step_S`` of the machine's v1 hierarchies
  (freezer only, with task/none), and a step's end kills its cgroup as on most GPU sites.

The compute hosts keep what the SSH hosts are: a private home per host with no agent in it,
sshd, the hosts' Python; the login user ``rdkuser`` runs the jobs. ``close()`` cancels the
session's jobs, stops the daemons by PID, removes the ``slurm_<node>`` cgroups and the
session's folder; the namespaces are the SSH hosts' to tear down.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass, field

from tests.waits import wait_for_sync

PACKAGES = ("slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "scancel",
            "munged", "mungekey")
MUNGE_KEY = "/etc/munge/munge.key"
KEY_LOCK = "/tmp/rankdeck-munge.lock"
CONF = """\
ClusterName={cluster}
SlurmctldHost={ctl_name}({ctl_addr})
MailProg=/bin/true
SlurmctldPort={ctl_port}
SlurmdPort={d_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
ProctrackType=proctrack/{proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/spool/%n/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
KillWait=2
InactiveLimit=0
MinJobAge=600
SchedulerParameters=sched_interval=2
{nodes}
PartitionName=test Nodes={node_names} Default=YES MaxTime={max_minutes} State=UP
"""
# proctrack/cgroup (create_cluster(proctrack="cgroup")): Slurm 22.05's cgroup/v1 plugin on the
# machine's v1 hierarchies (no systemd needed); proctrack/cgroup uses the freezer one only, and
# with task/none nothing is constrained: what changes is which processes a step owns.
CGROUP_CONF = """\
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainSwapSpace=no
ConstrainDevices=no
"""
PROCTRACKS = ("linuxproc", "cgroup")
# The cgroups are the machine's and named by node and job (slurm_node0/uid_U/job_1), the same in
# every session: one cgroup cluster at a time, or one session's step end kills another's steps.
CGROUP_LOCK = "/tmp/rankdeck-slurm-cgroup.lock"


def missing_slurm() -> str | None:
    """Why a Slurm cluster cannot be built here, or None."""
    missing = [p for p in PACKAGES if shutil.which(p) is None
               and not os.access("/usr/sbin/" + p, os.X_OK)]
    if missing:
        return ("needs Slurm and munge (%s missing): scripts/setup.sh --test installs "
                "slurmctld slurmd slurm-client munge as root" % ", ".join(missing))
    return None


def ensure_munge_key() -> None:
    """``/etc/munge/munge.key``, made once per machine (owner munge, 0400)."""
    with open(KEY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(MUNGE_KEY):
            subprocess.run(["mungekey", "-c", "-k", MUNGE_KEY], check=True, capture_output=True)
        pw = pwd.getpwnam("munge")
        os.chown(MUNGE_KEY, pw.pw_uid, pw.pw_gid)
        os.chmod(MUNGE_KEY, 0o400)


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def cgroup_mounts() -> list[tuple[str, str]]:
    """(mount point, options) of the root namespace's cgroup v1 hierarchies."""
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, point, fstype, opts = line.split()[:4]
            if fstype == "cgroup" and point.startswith("/sys/fs/cgroup/"):
                keep = [o for o in opts.split(",") if o not in ("rw", "ro", "relatime",
                                                                "nosuid", "nodev", "noexec")]
                out.append((point, ",".join(keep)))
    return out


@dataclass
class SlurmCluster:
    """The running cluster: ``nodes`` are the compute hosts' names (their hostnames)."""

    hosts: object  # tests/e2e/sshhosts.SshHosts
    nodes: list[str]
    base: str
    conf: str
    ctl_addr: str
    proctrack: str = "linuxproc"
    lock: object = None  # CGROUP_LOCK's file, held while a cgroup cluster runs
    procs: list[subprocess.Popen] = field(default_factory=list)
    _closed: bool = False

    def env(self) -> dict:
        """This machine's environment with SLURM_CONF set (for commands in the root namespace)."""
        return dict(os.environ, SLURM_CONF=self.conf)

    def cmd(self, argv, check: bool = True) -> str:
        """A Slurm command as root in the root namespace; its stdout."""
        res = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), res.returncode,
                                                   res.stderr.strip()))
        return res.stdout

    def as_user(self, script: str, host: str | None = None) -> str:
        """A shell script as the login user on ``host`` (default: the login host)."""
        return self.hosts.sh(host or self.login, script)

    @property
    def login(self) -> str:
        return [h for h in self.hosts.names if h not in self.nodes][0]

    def hold(self, count: int | None = None, minutes: int = 5, exclusive: bool = False) -> str:
        """A job holding ``count`` nodes (default all) with no shell, as the login user
        (``salloc --no-shell``; ``exclusive``: no other job shares them); its id once it runs."""
        out = self.as_user("salloc --no-shell -N %d -t %d -J rankdeck-hold %s2>&1"
                           % (count or len(self.nodes), minutes,
                              "--exclusive " if exclusive else ""))
        job = next((w for w in out.split() if w.isdigit()), None)
        if job is None:
            raise RuntimeError("salloc gave no job id: %s" % out)
        wait_for_sync(lambda: self.job_state(job) == "RUNNING", 60,
                      lambda: "job %s running (%s)" % (job, self.job_state(job)))
        return job

    def nodes_of(self, job: str) -> list[str]:
        """The job's nodes, sorted (``squeue %N`` expanded by ``scontrol show hostnames``)."""
        nodelist = self.cmd(["squeue", "-h", "-j", job, "-o", "%N"]).strip()
        return sorted(self.cmd(["scontrol", "show", "hostnames", nodelist]).split())

    def job_state(self, job: str) -> str:
        return self.cmd(["squeue", "-h", "-j", job, "-o", "%T"], check=False).strip()

    def steps(self, job: str) -> list[str]:
        """The job's steps still known to Slurm (``squeue -s``)."""
        return [line for line in self.cmd(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"],
                                          check=False).splitlines() if line.strip()]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        subprocess.run(["scancel", "--full", "-u", self.hosts.user], env=self.env(),
                       capture_output=True, timeout=30)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.proctrack == "cgroup":
            remove_cgroups(self.nodes)
        if self.lock is not None:
            self.lock.close()
        shutil.rmtree(self.base, ignore_errors=True)


def remove_cgroups(nodes: list[str]) -> None:
    """The cgroups the nodes' slurmds made (``<hierarchy>/slurm_<node>/uid_U/job_J/step_S``:
    a multiple-slurmd build names its tree per node), deepest first; one still holding a process
    stays (rmdir refuses it), and so does a tree that is not there."""
    for point, _opts in cgroup_mounts():
        for node in nodes:
            top = os.path.join(point, "slurm_" + node)
            for folder, _dirs, _files in os.walk(top, topdown=False):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass


def create_cluster(hosts, nodes: list[str], max_minutes: int = 5,
                   proctrack: str = "linuxproc") -> SlurmCluster:
    """Slurm on ``hosts`` (an SshHosts): ``nodes`` compute, the first other host the login.
    ``proctrack``: ``linuxproc`` (a step owns its process tree) or ``cgroup`` (a step owns its
    cgroup: what most GPU sites run)."""
    if proctrack not in PROCTRACKS:
        raise ValueError("proctrack %r: one of %s" % (proctrack, ", ".join(PROCTRACKS)))
    ensure_munge_key()
    base = os.path.join(hosts.base, "slurm")
    for sub in ("etc", "state", "log", "munge") + tuple("spool/" + n for n in nodes):
        os.makedirs(os.path.join(base, sub), exist_ok=True)
    munge = pwd.getpwnam("munge")
    os.chown(os.path.join(base, "munge"), munge.pw_uid, munge.pw_gid)
    os.chmod(os.path.join(base, "munge"), 0o755)
    ctl_addr = hosts.subnet + ".1"
    socket_path = os.path.join(base, "munge", "munge.sock")
    node_lines = "\n".join("NodeName=%s NodeAddr=%s CPUs=%d State=UNKNOWN"
                           % (n, hosts[n].addr, os.cpu_count() or 1) for n in nodes)
    conf = os.path.join(base, "etc", "slurm.conf")
    with open(conf, "w") as f:
        f.write(CONF.format(ctl_name=socket.gethostname().split(".")[0], cluster="rdk" + os.path.basename(hosts.base)[3:7], ctl_addr=ctl_addr,
                            ctl_port=free_port(ctl_addr), d_port=free_port("0.0.0.0"),
                            munge_socket=socket_path, base=base, nodes=node_lines,
                            node_names=",".join(nodes), max_minutes=max_minutes,
                            proctrack=proctrack))
    if proctrack == "cgroup":
        with open(os.path.join(base, "etc", "cgroup.conf"), "w") as f:
            f.write(CGROUP_CONF)
    cluster = SlurmCluster(hosts=hosts, nodes=list(nodes), base=base, conf=conf,
                           ctl_addr=ctl_addr, proctrack=proctrack)
    try:
        if proctrack == "cgroup":
            cluster.lock = open(CGROUP_LOCK, "a")
            fcntl.flock(cluster.lock, fcntl.LOCK_EX)
        _start(cluster, socket_path)
    except BaseException:
        cluster.close()
        raise
    return cluster


def _start(cluster: SlurmCluster, socket_path: str) -> None:
    base, hosts = cluster.base, cluster.hosts
    mdir = os.path.join(base, "munge")
    cluster.procs.append(subprocess.Popen(
        ["runuser", "-u", "munge", "--", "munged", "-F", "--socket=" + socket_path,
         "--key-file=" + MUNGE_KEY, "--pid-file=" + mdir + "/munged.pid",
         "--seed-file=" + mdir + "/munged.seed", "--log-file=" + mdir + "/munged.log"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    wait_for_sync(lambda: _alive(cluster) and os.path.exists(socket_path), 30, "munged's socket")
    with open(os.path.join(base, "log", "slurmctld.out"), "wb") as out:
        cluster.procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", cluster.conf],
                                              env=cluster.env(), stdin=subprocess.DEVNULL,
                                              stdout=out, stderr=out))
    etc = os.path.join(base, "etc")
    for name in hosts.names:  # every host reads the session's conf at /etc/slurm
        _in_host(hosts, name, "mount --bind %s /etc/slurm" % shlex.quote(etc))
    for name in cluster.nodes:
        mounts = ["mount -t tmpfs -o mode=755 tmpfs /sys/fs/cgroup"]
        for point, opts in cgroup_mounts():
            mounts += ["mkdir -p %s" % point, "mount -t cgroup -o %s cgroup %s" % (opts, point)]
        _in_host(hosts, name, " && ".join(mounts))
        with open(os.path.join(base, "log", "slurmd-%s.out" % name), "wb") as out:
            cluster.procs.append(subprocess.Popen(
                hosts[name].enter("TERM") + ["slurmd", "-D", "-N", name],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/"))

    def idle() -> bool:
        _alive(cluster)
        out = cluster.cmd(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return all(states.get(n) == "idle" for n in cluster.nodes)

    wait_for_sync(idle, 60, lambda: "every node idle in sinfo: %s" % cluster.cmd(
        ["sinfo", "-h", "-N", "-o", "%N %t"], check=False).strip())


def _alive(cluster: SlurmCluster) -> bool:
    for proc in cluster.procs:
        if proc.poll() is not None:
            name = proc.args[0] if proc.args[0] != "nsenter" else "slurmd"
            raise AssertionError("%s exited with %s: %s" % (name, proc.returncode,
                                                          _log_tail(cluster.base)))
    return True


def _log_tail(base: str) -> str:
    """The last lines of the session's daemon logs (read before close() removes them)."""
    tails = []
    for folder in (os.path.join(base, "log"), os.path.join(base, "munge")):
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if name.endswith((".log", ".out")):
                with open(os.path.join(folder, name), errors="replace") as f:
                    lines = f.read().strip().splitlines()[-4:]
                if lines:
                    tails.append("%s: %s" % (name, " | ".join(lines)))
    return "; ".join(tails)


def _in_host(hosts, name: str, script: str) -> None:
    res = hosts.run_on(name, ["sh", "-c", script], user=False, text=True)
    if res.returncode != 0:
        raise RuntimeError("on %s: %s: %s" % (name, script, res.stderr.strip()))
