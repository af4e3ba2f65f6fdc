"""Hosts for ``ray up`` on one machine: each is a network namespace of the multi-node
harness's kind (:mod:`.network`: a veth onto a bridge of its own, no route off it) with its
own PID, mount and UTS namespaces, whose PID 1 is ``sshd``.  A host sees the machine's
``/usr`` (its Python is Debian's ``/usr/bin/python3.11``, its ``ssh``, ``rsync`` and
``redis-server`` the machine's) and private ``/root``, ``/opt``, ``/tmp``, ``/run`` and
``/dev/shm``, and an ``/etc`` of its own: a copy with its name in ``/etc/hostname`` and
``/etc/hosts`` (Ray finds a node's address through its hostname when there is no default
route) and a ``pip.conf`` whose only package source is the wheelhouse, bind-mounted read-only
at :data:`WHEELHOUSE_MOUNT` (hosts reach no registry).  Root logs in with the generated key.

Everything is named with :data:`PREFIX` (``rwsup-``) on :data:`SUBNET`, apart from the tier's
``rwsmn-`` harness, so either can run and be cleaned up (``make multinode-clean`` does both).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import network, processes
from .cleanup import HOSTS_PREFIX, temp_dirs
from .topology import Node, NodeSpec, Topology, leftovers

PREFIX = HOSTS_PREFIX
SUBNET = "10.213.38.0/24"
WHEELHOUSE_MOUNT = "/opt/wheelhouse"
SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
# The roles configs/cluster-local.yaml gives its hosts: a head, two session nodes, one
# accelerator node (the fewest that show every role and a drain).
DEFAULT_SPECS = (
    NodeSpec("head"),
    NodeSpec("session"),
    NodeSpec("session"),
    NodeSpec("accelerator"),
)
PIP_CONF = f"[global]\nno-index = true\nfind-links = {WHEELHOUSE_MOUNT}\ndisable-pip-version-check = true\n"
SSHD_CONFIG = """\
Port 22
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PidFile /run/sshd.pid
Subsystem sftp internal-sftp
MaxStartups 64:30:128
MaxSessions 64
"""


class HostError(RuntimeError):
    pass


def host_script(root: Path, hostname: str, wheelhouse: Path) -> str:
    """What runs as the host's PID 1 (inside its new mount, PID and UTS namespaces): the
    private mounts, then ``exec sshd``.  The wheelhouse is bound first (it may live under the
    machine's /root), ``/tmp`` last (``root`` lives under the machine's ``/tmp``)."""
    r = shlex.quote(str(root))
    point = f"{r}/opt{WHEELHOUSE_MOUNT[len('/opt') :]}"
    lines = [
        "set -e",
        f"hostname {shlex.quote(hostname)}",
        f"mount --bind {shlex.quote(str(wheelhouse))} {point}",
        f"mount -o remount,ro,bind {point}",
        f"mount --bind {r}/etc /etc",
        f"mount --bind {r}/root /root",
        f"mount --rbind {r}/opt /opt",  # with the wheelhouse mounted in it
        "mount -t tmpfs -o size=64m,mode=755 tmpfs /run",
        "mkdir -p /run/sshd",
        "mount -t tmpfs -o size=256m tmpfs /dev/shm",  # Ray's object store: small, the host's own
        f"mount --bind {r}/tmp /tmp",
        f"exec {SSHD} -D -e -f /etc/ssh/sshd_config",
    ]
    return "\n".join(lines)


def prepare_root(root: Path, node: Node, hosts_lines: str, public_key: str) -> None:
    """The host's private directories: an /etc copy (its hostname, every host in
    /etc/hosts, pip's only source the wheelhouse, sshd's config), /root with the key
    authorised, empty /opt and /tmp, the wheelhouse's mount point."""
    for d in ("root/.ssh", "tmp", f"opt{WHEELHOUSE_MOUNT[len('/opt') :]}"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    subprocess.run(["cp", "-a", "/etc", str(root / "etc")], check=True, timeout=60)
    etc = root / "etc"
    (etc / "hostname").write_text(f"{node.namespace}\n")
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts_lines}")
    (etc / "pip.conf").write_text(PIP_CONF)
    shutil.rmtree(etc / "xdg" / "pip", ignore_errors=True)  # the machine's own package sources
    (etc / "ssh" / "sshd_config").write_text(SSHD_CONFIG)
    shutil.rmtree(etc / "ssh" / "sshd_config.d", ignore_errors=True)
    (root / "root" / ".ssh" / "authorized_keys").write_text(public_key)
    (root / "root" / ".ssh").chmod(0o700)
    (root / "root" / ".ssh" / "authorized_keys").chmod(0o600)
    (root / "root" / ".bashrc").write_text("")


@dataclass
class Hosts:
    """``with Hosts(wheelhouse) as hosts:`` — the hosts up, sshd answering on each; torn down
    on exit (every process in their namespaces SIGKILLed, namespaces, interfaces and the temp
    dir removed), also on an error in the set-up.  Refuses to start beside a leftover."""

    wheelhouse: Path
    specs: tuple[NodeSpec, ...] = DEFAULT_SPECS
    prefix: str = PREFIX
    subnet: str = SUBNET
    start_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        self.topology = Topology(self.specs, prefix=self.prefix, subnet=self.subnet)
        self.temp_dir: Path | None = None
        self.procs: list[subprocess.Popen] = []
        self._stopped = True

    @property
    def nodes(self) -> list[Node]:
        return self.topology.nodes

    @property
    def key(self) -> Path:
        assert self.temp_dir is not None
        return self.temp_dir / "id_ed25519"

    def __enter__(self) -> Hosts:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("ray-up hosts need root (namespaces, a bridge, mounts)")
        for binary in (SSHD, "/usr/bin/rsync", "/usr/bin/ssh", "/usr/bin/python3.11"):
            if not Path(binary).exists():
                raise HostError(f"{binary} is missing: `make ray-up-hosts` installs openssh-server and rsync")
        left = leftovers(network.links(), network.namespaces(), temp_dirs(self.prefix), self.prefix)
        if left:
            raise HostError(
                "ray-up hosts were left behind (or are running): " + ", ".join(left) + "; remove them with "
                f"`python -m bench.multinode.cleanup --prefix {self.prefix}` (make multinode-clean)"
            )
        if not any(self.wheelhouse.glob("ray-*.whl")):
            raise HostError(f"no wheelhouse at {self.wheelhouse}: `make wheelhouse`")
        self._stopped = False
        self.temp_dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-", dir="/tmp"))
        try:
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ray-up-test", "-f", str(self.key)],
                check=True,
                timeout=30,
                capture_output=True,
            )
            public = self.key.with_suffix(".pub").read_text()
            hosts_lines = "".join(f"{n.address} {n.namespace}\n" for n in self.nodes)
            network.create(self.topology)
            network.check_isolated(self.topology)
            for node in self.nodes:
                root = self.temp_dir / "hosts" / node.name
                prepare_root(root, node, hosts_lines, public)
                cmd = network.in_namespace(
                    node.namespace,
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount",
                    "--uts",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    host_script(root, node.namespace, self.wheelhouse.resolve()),
                )
                self.procs.append(processes.launch(cmd, self.temp_dir / f"{node.name}-sshd.log", os.environ))
            deadline = time.monotonic() + self.start_timeout_s
            for node in self.nodes:
                self.wait_ssh(node, deadline)
        except BaseException:
            self.stop()
            raise

    def ssh_command(self, node: Node) -> list[str]:
        """``ssh`` as root onto the host with the generated key (append the remote command)."""
        opts = ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR", "BatchMode=yes"]
        return [
            "ssh",
            "-i",
            str(self.key),
            *(f"-o{o}" for o in opts),
            "-oConnectTimeout=5",
            f"root@{node.address}",
        ]

    def ssh(self, node: Node, command: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``command`` on the host over SSH as root (the hosts' own shell, PID namespace)."""
        return subprocess.run(
            [*self.ssh_command(node), command], capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def wait_ssh(self, node: Node, deadline: float) -> None:
        while True:
            res = self.ssh(node, "hostname", timeout_s=10)
            if res.returncode == 0 and res.stdout.strip() == node.namespace:
                return
            if time.monotonic() > deadline:
                assert self.temp_dir is not None
                log = (self.temp_dir / f"{node.name}-sshd.log").read_text(errors="replace")
                raise HostError(f"{node.name}: no SSH: {res.stderr.strip()} / sshd: {log[-2000:]}")
            time.sleep(0.3)

    def processes_of(self, node: Node) -> dict[int, str]:
        """Every process in the host (pid as the machine sees it → command line), sshd included."""
        out = {}
        for pid in network.namespace_pids(node.namespace):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            out[pid] = cmdline or f"[{Path(f'/proc/{pid}/comm').read_text().strip()}]"
        return out

    def stop(self) -> None:
        """SIGKILL every process of every host, unmount the wheelhouse binds, remove the
        namespaces, interfaces and temp dir.  Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                processes.kill_namespace(node.namespace)
            except Exception as exc:  # noqa: BLE001 - the rest must still be torn down
                errors.append(exc)
        processes.reap(self.procs)
        network.destroy(self.prefix)
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if errors:
            raise errors[0]
