"""A throwaway OpenSSH server on 127.0.0.1, for tests and benchmarks of xdist's ssh workers.

Debian's ``openssh-server`` run as a process of its own: a fresh host key and client key,
its own ``sshd_config`` (no PAM, no strict modes, the authorized keys in the temporary
directory), listening on a free loopback port. The client side is an ``ssh_config`` file
naming the host ``osmosis-sshd``, for execnet's ``//ssh_config=`` (``Sshd.tx``).

The "remote host" is this machine, so a test says what it would differ in: the sessions
it starts get ``environ`` (``SetEnv``: the plugin importable, offline LiteLLM) and nothing
of the test's own environment (no provider key: that must travel over xdist's channel).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
HOST = "osmosis-sshd"


def missing() -> str | None:
    """Why no sshd can be started here, or None (the tests skip with this reason)."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is not installed (apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Sshd:
    """A running sshd; ``stop()`` ends it."""

    process: subprocess.Popen[bytes]
    port: int
    ssh_config: Path
    log: Path

    def tx(self, python: str, chdir: str | None = None) -> str:
        """An xdist ``--tx`` spec of one worker on this host."""
        spec = f"ssh={HOST}//ssh_config={self.ssh_config}//python={python}"
        return spec + (f"//chdir={chdir}" if chdir else "")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(directory: Path, environ: Mapping[str, str]) -> Sshd:
    """Start sshd with its files under *directory*; sessions get *environ* (SetEnv)."""
    directory.mkdir(parents=True, exist_ok=True)
    host_key, client_key = directory / "host_key", directory / "client_key"
    for key in (host_key, client_key):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
            check=True,
            capture_output=True,
        )
    (directory / "authorized_keys").write_bytes(client_key.with_suffix(".pub").read_bytes())
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # its privilege-separation directory
    port = _free_port()
    setenv = " ".join(f'"{name}={value}"' for name, value in environ.items())
    config = directory / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
        f"PidFile {directory / 'sshd.pid'}\nAuthorizedKeysFile {directory / 'authorized_keys'}\n"
        "UsePAM no\nStrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nMaxStartups 50\n"
        "MaxSessions 50\nPrintMotd no\n" + (f"SetEnv {setenv}\n" if setenv else "")
    )
    user = os.environ.get("USER") or __import__("getpass").getuser()
    ssh_config = directory / "ssh_config"
    ssh_config.write_text(
        f"Host {HOST}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
        f"  IdentityFile {client_key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        f"  StrictHostKeyChecking no\n  UserKnownHostsFile {directory / 'known_hosts'}\n"
        "  LogLevel ERROR\n"
    )
    log = directory / "sshd.log"
    process = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    server = Sshd(process, port, ssh_config, log)
    deadline = time.monotonic() + 60  # a loaded machine; it answers in milliseconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()}")
        probe = subprocess.run(
            ["ssh", "-F", str(ssh_config), HOST, "true"], capture_output=True, timeout=60
        )
        if probe.returncode == 0:
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"sshd did not answer: {log.read_text()}")
