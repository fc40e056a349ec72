"""Benchmark 16 — xdist workers over ssh add little (issue 27 §2).

One workspace of 1,000 rows whose workflow awaits 200 ms (no model call), ``batch_size``
64. Side A: ``-n 2`` (two local workers). Side B: two workers on this machine reached over
ssh (``-d --tx ssh=…//python=… --tx ssh=…``), through Debian's sshd on 127.0.0.1 started
here with a throwaway key (tests/sshd.py). Runs are interleaved (A, B, A, B, ...) and the
best wall of each side compared. Side B pays what a remote host costs: an ssh connection
per worker and one more for the workspace check, the results' and trajectories' trip back
over the channel. Target (``../shared/design.md`` §3): B's wall <= 1.15x A's. (Side B's
CPU column counts the controller and the ssh clients only: its workers are sshd's children.)

Needs ``/usr/sbin/sshd`` (``apt-get install openssh-server``) and root (sshd's
``/run/sshd``); without them it prints why and records no check.

    python bench/ssh_workers.py [--items 1000] [--sleep 0.2] [--batch 64] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _common as c

sys.path.insert(0, str(c.REPO / "tests"))
import sshd  # noqa: E402  (tests/sshd.py: the throwaway sshd)


def measure(items: int, sleep: float, batch: int, repeat: int) -> tuple[list[c.Run], list[c.Run]]:
    local: list[c.Run] = []
    remote: list[c.Run] = []
    with c.tempdir("bench-ssh-") as tmp, c.model_server(0.0) as env:
        ws = c.eval_workspace(tmp / "ws", items, batch_size=batch)
        bench_env = {**env, "BENCH_SLEEP": str(sleep)}
        # The remote host's own environment: the plugin, offline LiteLLM, the workload's
        # parameter (the model's variables travel over xdist's channel).
        measured = c.measured_env(bench_env)
        setenv = {
            k: measured[k] for k in (*c.OFFLINE_ENV, "BENCH_SLEEP", "PYTHONPATH") if k in measured
        }
        server = sshd.start(tmp / "sshd", setenv)
        try:
            spec = server.tx(c.PYTHON)
            for i in range(repeat):
                local.append(
                    c.run(
                        f"-n 2, {items} rows #{i + 1}",
                        c.osmosis_cmd("-n", "2", "--osmosis-name", f"local{i}", output=tmp / "out"),
                        cwd=ws,
                        env=bench_env,
                    ).check(f"{items} passed")
                )
                remote.append(
                    c.run(
                        f"2 ssh workers, {items} rows #{i + 1}",
                        c.osmosis_cmd(
                            "-d",
                            "--tx",
                            spec,
                            "--tx",
                            spec,
                            "--osmosis-name",
                            f"ssh{i}",
                            output=tmp / "out",
                        ),
                        cwd=ws,
                        env=bench_env,
                    ).check(f"{items} passed")
                )
        finally:
            server.stop()
    return local, remote


def checks(local: list[c.Run], remote: list[c.Run]) -> list[c.Check]:
    base = min(r.wall for r in local)
    over_ssh = min(r.wall for r in remote)
    return [
        c.Check(
            "ssh workers: 2 over ssh vs -n 2",
            f"ssh {over_ssh:.2f} s vs -n 2 {base:.2f} s wall",
            "<= 1.15x the wall of -n 2",
            over_ssh / base,
            1.15,
            notes=[f"ratio {over_ssh / base:.2f}x (best of {len(remote)} each, interleaved)"],
            sdk=c.no_sdk("pytest-only"),
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("xdist workers over ssh")
    reason = sshd.missing()
    if reason is None and not Path("/run/sshd").exists():
        try:
            Path("/run/sshd").mkdir(parents=True)
        except OSError as exc:
            reason = f"sshd needs /run/sshd: {exc}"
    if reason is not None:
        print(f"skipped: {reason}")
        c.finish("benchmark 16: ssh workers", [], args.json)
        return
    local, remote = measure(args.items, args.sleep, args.batch, args.repeat)
    c.print_runs([*local, *remote])
    print(f"after: {c.loadavg()}")
    ratio = min(r.wall for r in remote) / min(r.wall for r in local)
    print(f"ssh / -n 2 wall ratio: {ratio:.2f}x (target <= 1.15x)")
    c.finish("benchmark 16: ssh workers", checks(local, remote), args.json)


if __name__ == "__main__":
    main()
