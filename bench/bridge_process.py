"""The session's bridge in process vs in a process of its own (issue 30 item 2, option (a)).

One invocation, interleaved pairs: the same 1,000-row workspace, each row one model call
through the LiteLLM route (an https stub with a self-signed certificate and
``OPENAI_ORGANIZATION`` set, as ``xdist_helps.py --route litellm``), 64 in flight,
``OSMOSIS_BRIDGE_PROCESS=0`` then ``=1``; wall, and CPU of the pytest process and of the
bridge process from /proc (xdist_helps.cpu_by_process), with the load average of each run.

    $ PYTHONPATH=$PWD python bench/bridge_process.py [--items 1000] [--repeat 2]
"""

from __future__ import annotations

import argparse

import _common as c
from xdist_helps import cpu_by_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--delay", type=float, default=0.2, help="model server delay, s")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    c.header(f"bridge in process vs its own process: {args.items} LiteLLM-route calls")
    with c.tempdir("bench-bproc-") as tmp, c.model_server(args.delay, tls=True) as env:
        ws = c.eval_workspace(tmp / "ws", args.items, batch_size=args.batch)
        extra = {"BENCH_MODE": "bridge", "BENCH_CLIENT": "httpx", "OPENAI_ORGANIZATION": "org"}
        for i in range(args.repeat):
            for placed in ("0", "1"):
                cpu: dict[str, float] = {}
                load = c.loadavg()
                with cpu_by_process(cpu):
                    r = c.run(
                        f"OSMOSIS_BRIDGE_PROCESS={placed} #{i + 1}",
                        c.osmosis_cmd(f"--osmosis-output={tmp / f'out-{placed}-{i}'}"),
                        cwd=ws,
                        env={**env, **extra, "OSMOSIS_BRIDGE_PROCESS": placed},
                    ).check(f"{args.items} passed")
                parts = ", ".join(
                    f"{role} {s:.2f}" for role, s in cpu.items() if role != "model server"
                )
                print(
                    f"{r.label}: wall {r.wall:.2f} s, CPU {r.cpu:.2f} s ({parts}); "
                    f"{load} -> {c.loadavg()}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
