"""Benchmark 2 — through the bridge (issue 4 §7, design.md §3).

The same 1,000 items, each making one real model call through the plugin's loopback
bridge (``httpx`` POST to ``get_rollout_context().chat_completions_url``) to the loopback
model server answering after 200 ms, against ``litellm.acompletion`` called directly
at the same concurrency (64) in a separate process. Target: CPU per call <= 1.3 x
LiteLLM's, on both routes a call takes: ``direct`` (the server over plain HTTP: an
OpenAI-compatible endpoint, called without LiteLLM) and ``litellm`` (the same server over
https with a certificate made for the run: the stand-in for a real provider, which rows
reach through LiteLLM).

CPU is ``getrusage(RUSAGE_CHILDREN)`` user+sys around each subprocess; the model server
is its own long-lived process and is never in a delta. Fixed costs (interpreter, LiteLLM
import, pytest start-up, preflight) are removed by running each side at two sizes:

    CPU per call = (CPU(N) - CPU(N_small)) / (N - N_small)   (same for wall -> calls/s)

The total CPU divided by N is printed too. The direct script also times its call phase
in-process (``time.process_time``), a third view of LiteLLM's own cost. A third side
runs the benchmark rollout's httpx client alone against the model server, so the
plugin's number can be split into LiteLLM + the workflow's client + bridge and harness.

With ``--calls-per-row K`` (default 10) each route is measured again with rows that make K
calls one after the other (N/K and N_small/K rows): the same calls in a tenth of the rows.
Per-row cost (pytest's protocol, the row's files, the rollout's start) then comes apart
from per-call cost: ``per row = (C1 - CK) / (1 - 1/K)`` for the marginal CPU per call C1 at
one call a row and CK at K; the line it prints is for reading, the target stays C1.

Where ``osmosis-ai`` imports, ``osmosis eval run`` runs ``--sdk-items`` (default 500: its
rows cost ~35 times ours in CPU) and ``--small`` rows once each (``_common.sdk_run``; its LiteLLM
bridge, its rollout server in a child process whose CPU it reaps, so the delta holds
both): its CPU per call by the same difference, and ours / its. With ``--client
bridge_client`` (ours alone) there is no SDK side.

    python bench/through_bridge.py [--items 1000] [--small 100] [--batch 64] [--repeat 2]
                                   [--sdk-items 500] [--calls-per-row 10]
                                   [--client httpx|aiohttp|httpx-per-call|bridge_client]
"""

from __future__ import annotations

import argparse
import json

import _common as c

DIRECT = """
import asyncio, json, sys, time

n, concurrency = int(sys.argv[1]), int(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
import litellm

litellm.suppress_debug_info = True


async def main():
    # One call first, as the plugin's preflight makes one.
    await litellm.acompletion(model="openai/bench", messages=[{"role": "user", "content": "hi"}],
                              max_tokens=256, drop_params=True)
    t1, c1 = time.perf_counter(), time.process_time()
    gate = asyncio.Semaphore(concurrency)

    async def one(i):
        async with gate:
            r = await litellm.acompletion(
                model="openai/bench",
                messages=[{"role": "user", "content": f"What is {i} + 1?"}],
                drop_params=True,
            )
            assert r.choices[0].message.content == str(i + 1), r

    await asyncio.gather(*(one(i) for i in range(n)))
    t2, c2 = time.perf_counter(), time.process_time()
    print(json.dumps({"calls": n, "setup_s": t1 - t0, "setup_cpu": c1 - c0,
                      "phase_s": t2 - t1, "phase_cpu": c2 - c1}))


asyncio.run(main())
"""

# The rollout's own HTTP client alone: the same httpx client settings as the benchmark
# rollout, straight to the model server. Its CPU is the part of the plugin's number that
# belongs to the workflow's client, not to the bridge or the harness.
HTTPX = """
import asyncio, json, os, sys, time

n, concurrency, kind = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"


async def main():
    if kind == "aiohttp":
        import aiohttp

        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    else:
        import httpx

        client = httpx.AsyncClient(timeout=60)
    per_call = kind == "httpx-per-call"
    gate = asyncio.Semaphore(concurrency)

    async def one(i):
        body = {"model": "bench", "messages": [{"role": "user", "content": f"What is {i} + 1?"}]}
        async with gate:
            if kind == "aiohttp":
                async with client.post(url, headers={"Authorization": "Bearer x"}, json=body) as r:
                    r.raise_for_status()
                    answer = await r.json()
            elif per_call:
                async with httpx.AsyncClient(timeout=60) as own:
                    r = await own.post(url, headers={"Authorization": "Bearer x"}, json=body)
                    r.raise_for_status()
                    answer = r.json()
            else:
                r = await client.post(url, headers={"Authorization": "Bearer x"}, json=body)
                r.raise_for_status()
                answer = r.json()
            assert answer["choices"][0]["message"]["content"] == str(i + 1)

    t1, c1 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(i) for i in range(n)))
    t2, c2 = time.perf_counter(), time.process_time()
    await client.aclose() if kind != "aiohttp" else await client.close()
    print(json.dumps({"calls": n, "phase_s": t2 - t1, "phase_cpu": c2 - c1}))


asyncio.run(main())
"""


ROUTES = ("direct", "litellm")
"""The two routes a row's call takes: ``direct`` to an OpenAI-compatible endpoint over plain
HTTP (model/direct.py, no LiteLLM), ``litellm`` to an https provider (every real one): the
model server serves https with a self-signed certificate made for the run, trusted through
``SSL_CERT_FILE`` (`_common.model_server`). Each is compared with bare
``litellm.acompletion`` against the same server."""


def measure(
    items: int,
    small: int,
    batch: int,
    repeat: int,
    client_kind: str,
    sdk_items: int,
    routes: tuple[str, ...] = ROUTES,
    per_row: int = 0,
) -> dict[str, dict[int, list[c.Run]]]:
    runs: dict[str, dict[int, list[c.Run]]] = {"httpx": {}}
    with (
        c.tempdir("bench-bridge-") as tmp,
        c.model_server(0.2) as plain,
        c.model_server(0.2, tls=True) as tls,
    ):
        servers = {"direct": plain, "litellm": tls}
        rows = {items, small} | ({items // per_row, small // per_row} if per_row else set())
        ws_by_n = {n: c.eval_workspace(tmp / f"ws{n}", n, batch_size=batch) for n in rows}
        script = tmp / "direct.py"
        script.write_text(DIRECT)
        client = tmp / "client.py"
        client.write_text(HTTPX)
        for i in range(repeat):
            for n in (items, small):
                for route in routes:
                    env = servers[route]
                    out = tmp / f"out-{route}-{n}-{i}"
                    r = c.run(
                        f"plugin, {route} route, {n} calls #{i + 1}",
                        c.osmosis_cmd(output=out),
                        cwd=ws_by_n[n],
                        env={**env, "BENCH_MODE": "bridge", "BENCH_CLIENT": client_kind},
                    ).check(f"{n} passed")
                    runs.setdefault(f"plugin {route}", {}).setdefault(n, []).append(r)
                    if per_row:
                        # The same n calls, per_row of them in each of n / per_row rows.
                        k = c.run(
                            f"plugin, {route} route, {n} calls, {per_row} a row #{i + 1}",
                            c.osmosis_cmd(output=tmp / f"out-{route}-{n}-k{per_row}-{i}"),
                            cwd=ws_by_n[n // per_row],
                            env={
                                **env,
                                "BENCH_MODE": "bridge",
                                "BENCH_CLIENT": client_kind,
                                "BENCH_CALLS": str(per_row),
                            },
                        ).check(f"{n // per_row} passed")
                        runs.setdefault(f"plugin {route} k", {}).setdefault(n, []).append(k)
                    d = c.run(
                        f"litellm.acompletion alone, {env['OPENAI_BASE_URL'][:5]}, {n} calls "
                        f"#{i + 1}",
                        [c.PYTHON, str(script), str(n), str(batch)],
                        cwd=tmp,
                        env=env,
                    ).check('"calls"')
                    runs.setdefault(f"litellm {route}", {}).setdefault(n, []).append(d)
                # The rollout's client talks to the bridge over plain HTTP on either route.
                h = c.run(
                    f"{client_kind} client alone, {n} calls #{i + 1}",
                    [c.PYTHON, str(client), str(n), str(batch), client_kind],
                    cwd=tmp,
                    env=plain,
                ).check('"calls"')
                runs["httpx"].setdefault(n, []).append(h)
        if sdk_items:
            if sdk_items not in ws_by_n:
                ws_by_n[sdk_items] = c.eval_workspace(
                    tmp / f"ws{sdk_items}", sdk_items, batch_size=batch
                )
            runs["sdk"] = {
                n: [
                    c.sdk_run(
                        f"osmosis eval run, {n} calls",
                        ws_by_n[n],
                        output=tmp / f"sdk-{n}",
                        batch_size=batch,
                        env={**plain, "BENCH_MODE": "bridge", "BENCH_CLIENT": client_kind},
                        rows=n,
                    )
                ]
                for n in (sdk_items, small)
            }
    return runs


def _phase(r: c.Run) -> dict[str, float]:
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def checks(
    items: int,
    small: int,
    runs: dict[str, dict[int, list[c.Run]]],
    client_kind: str,
    per_row: int = 0,
) -> list[c.Check]:
    per: dict[str, dict[str, float]] = {}
    for side, by_n in runs.items():
        n_big = max(by_n)  # items, or the SDK's --sdk-items
        big, little = by_n[n_big], by_n[small]
        cpu_big, cpu_small = min(r.cpu for r in big), min(r.cpu for r in little)
        wall_big, wall_small = min(r.wall for r in big), min(r.wall for r in little)
        per[side] = {
            "n": n_big,
            "marginal_cpu_ms": (cpu_big - cpu_small) / (n_big - small) * 1000,
            "total_cpu_ms": cpu_big / n_big * 1000,
            "marginal_rate": (n_big - small) / max(wall_big - wall_small, 1e-9),
            "overall_rate": n_big / wall_big,
            "wall": wall_big,
            "cpu": cpu_big,
        }
    client = per["httpx"]
    client_phase = min(_phase(r)["phase_cpu"] for r in runs["httpx"][items]) / items * 1000
    ideal_rate = 64 / 0.2
    found = []
    for route in ROUTES:
        if f"plugin {route}" not in per:
            continue
        ours, theirs = per[f"plugin {route}"], per[f"litellm {route}"]
        phases = [_phase(r) for r in runs[f"litellm {route}"][items]]
        phase_cpu_ms = min(p["phase_cpu"] for p in phases) / items * 1000
        phase_rate = max(items / p["phase_s"] for p in phases)
        rest = ours["marginal_cpu_ms"] - theirs["marginal_cpu_ms"] - client["marginal_cpu_ms"]
        sdk = c.no_sdk("ours-only") if client_kind == "bridge_client" else c.sdk_absent()
        if "sdk" in per and route == "direct":
            theirs_sdk = per["sdk"]
            sdk = c.versus_sdk(
                f"{theirs_sdk['marginal_cpu_ms']:.2f} ms CPU/call marginal = "
                f"{theirs_sdk['marginal_cpu_ms'] / theirs['marginal_cpu_ms']:.2f} x litellm; "
                f"{theirs_sdk['marginal_rate']:.0f} calls/s marginal, wall "
                f"{theirs_sdk['wall']:.2f} s for {theirs_sdk['n']:.0f} ({theirs_sdk['n']:.0f} vs "
                f"{small} calls)",
                ours["marginal_cpu_ms"],
                theirs_sdk["marginal_cpu_ms"],
                "CPU/call",
            )
        where = "plain HTTP, no LiteLLM" if route == "direct" else "https, through LiteLLM"
        split = []
        if f"plugin {route} k" in per:
            at_k = per[f"plugin {route} k"]["marginal_cpu_ms"]
            row = (ours["marginal_cpu_ms"] - at_k) / (1 - 1 / per_row)
            call = ours["marginal_cpu_ms"] - row
            upstream = "our call-building" if route == "litellm" else "direct client"
            rest_k = (
                call
                - client["marginal_cpu_ms"]
                - (theirs["marginal_cpu_ms"] if route == "litellm" else 0.0)
            )
            split = [
                f"{per_row} calls a row: {at_k:.2f} ms CPU per call marginal, so per row "
                f"(pytest's protocol, the row's files, its start) {row:.2f} ms and per call "
                f"without it {call:.2f} ms = {client_kind} client "
                f"{client['marginal_cpu_ms']:.2f}"
                + (f" + litellm {theirs['marginal_cpu_ms']:.2f}" if route == "litellm" else "")
                + f" + bridge server and {upstream} {rest_k:.2f} ms (for reading; the target "
                "is the one-call-a-row figure)"
            ]
        found.append(
            c.Check(
                f"bridge: CPU per call, {route} route ({client_kind} client in the rollout)",
                f"plugin {ours['marginal_cpu_ms']:.2f} ms vs litellm.acompletion "
                f"{theirs['marginal_cpu_ms']:.2f} ms (marginal, {items} vs {small} calls, "
                f"{where})",
                "plugin CPU per call <= 1.3 x litellm direct",
                ours["marginal_cpu_ms"] / theirs["marginal_cpu_ms"],
                1.3,
                notes=[
                    f"total CPU / calls (incl. start-up): plugin {ours['total_cpu_ms']:.2f} ms "
                    f"({ours['cpu']:.2f} s), litellm {theirs['total_cpu_ms']:.2f} ms "
                    f"({theirs['cpu']:.2f} s) -> ratio "
                    f"{ours['total_cpu_ms'] / theirs['total_cpu_ms']:.3f}",
                    f"litellm call phase measured in-process: {phase_cpu_ms:.2f} ms CPU per call",
                    f"the rollout's {client_kind} client alone (to the model server over plain "
                    f"HTTP): {client['marginal_cpu_ms']:.2f} ms marginal, {client_phase:.2f} ms "
                    "in-process",
                    f"so plugin = litellm {theirs['marginal_cpu_ms']:.2f} + {client_kind} client "
                    f"{client['marginal_cpu_ms']:.2f} + bridge server and harness {rest:.2f} ms",
                    *split,
                    f"calls/s marginal: plugin {ours['marginal_rate']:.0f}, litellm "
                    f"{theirs['marginal_rate']:.0f} (ideal 64 / 0.2 s = {ideal_rate:.0f}); "
                    f"litellm call phase in-process {phase_rate:.0f}/s",
                    f"calls/s overall (N / wall incl. start-up): plugin "
                    f"{ours['overall_rate']:.0f} (wall {ours['wall']:.2f} s), litellm "
                    f"{theirs['overall_rate']:.0f} (wall {theirs['wall']:.2f} s)",
                    "min over repeats of each (size, side) before taking differences",
                ],
                sdk=sdk,
            )
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--client",
        choices=("httpx", "aiohttp", "httpx-per-call", "bridge_client"),
        default="httpx",
        help="the rollout's HTTP client (one httpx client with its default limits, aiohttp, "
        "a new httpx client per call, or the plugin's bridge_client; alone, bridge_client "
        "is measured as one shared httpx client)",
    )
    parser.add_argument(
        "--route", choices=(*ROUTES, "both"), default="both", help="which route(s) to measure"
    )
    parser.add_argument("--sdk-items", type=int, default=500, help="the SDK side's N")
    parser.add_argument(
        "--calls-per-row",
        type=int,
        default=10,
        help="also measure rows making K calls each (per-row vs per-call cost; 0: not); "
        "skipped unless K divides --items and --small",
    )
    parser.add_argument("--no-sdk", action="store_true", help="skip osmosis eval run")
    parser.add_argument("--json", help="also write the checks to this file")
    args = parser.parse_args()
    c.header("through the bridge")
    sdk = c.sdk_installed() and not args.no_sdk and args.client != "bridge_client"
    if sdk and args.sdk_items <= args.small:
        parser.error("--sdk-items must be larger than --small")
    sdk_items = args.sdk_items if sdk else 0
    routes = ROUTES if args.route == "both" else (args.route,)
    k = args.calls_per_row
    per_row = k if k > 1 and args.items % k == 0 and args.small % k == 0 else 0
    runs = measure(
        args.items, args.small, args.batch, args.repeat, args.client, sdk_items, routes, per_row
    )
    c.print_runs([r for side in runs.values() for rs in side.values() for r in rs])
    print(f"after: {c.loadavg()}")
    c.finish(
        "benchmark 2: through the bridge",
        checks(args.items, args.small, runs, args.client, per_row),
        args.json,
    )


if __name__ == "__main__":
    main()
