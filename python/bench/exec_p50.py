"""Exec latency through the Python client vs the TypeScript client vs raw HTTP loops, in one
run against one real dsec, and the RL rollout example's throughput.

Clients, each running the same command in the same sandbox, one call at a time:
  py-raw    http.client on one kept-alive connection, no SDK (the Python floor)
  py-sync   dsec.Sandbox.commands.run
  py-async  dsec.AsyncSandbox.commands.run (one event loop)
  ts-raw    Node fetch on undici's kept-alive pool, no SDK (the Node floor)
  ts-sdk    @dsec/sdk Sandbox.commands.run
Rounds rotate the order (A B C D E, B C D E A, ...) so the shared host's noise lands on all alike.

    python3 python/bench/exec_p50.py [--rounds 6] [--n 100] [--rollout-tasks 4 --rollout-group 8]

Writes bench/results/python-<UTC stamp>.{json,md} (with this command line) and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import dsec  # noqa: E402
import harness  # noqa: E402


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def py_raw(url: str, key: str, sid: str, cmd: str, n: int, warm: int) -> List[float]:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port))
    body = json.dumps({"cmd": cmd})
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    out = []
    for i in range(warm + n):
        t = time.perf_counter()
        conn.request("POST", f"/v1/sandboxes/{sid}/exec", body, headers)
        r = json.loads(conn.getresponse().read())
        assert r["exitCode"] == 0, r
        if i >= warm:
            out.append((time.perf_counter() - t) * 1000)
    conn.close()
    return out


def py_sync(sb: dsec.Sandbox, cmd: str, n: int, warm: int) -> List[float]:
    out = []
    for i in range(warm + n):
        t = time.perf_counter()
        r = sb.commands.run(cmd)
        assert r.exit_code == 0, r
        if i >= warm:
            out.append((time.perf_counter() - t) * 1000)
    return out


def py_async(url: str, key: str, sid: str, cmd: str, n: int, warm: int) -> List[float]:
    async def go() -> List[float]:
        sb = await dsec.AsyncSandbox.connect(sid, url=url, api_key=key)
        out = []
        for i in range(warm + n):
            t = time.perf_counter()
            r = await sb.commands.run(cmd)
            assert r.exit_code == 0, r
            if i >= warm:
                out.append((time.perf_counter() - t) * 1000)
        return out

    return asyncio.run(go())


def ts(mode: str, url: str, key: str, sid: str, cmd: str, n: int, warm: int) -> List[float]:
    script = os.path.join(HERE, "ts_exec_loop.mjs")
    r = subprocess.run(["node", script, mode, url, key, sid, str(n), str(warm), cmd], cwd=REPO, capture_output=True, text=True, check=True)
    return [float(x) for x in json.loads(r.stdout)]


def host_info() -> Dict[str, Any]:
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "node": node,
        "git": subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description="exec p50: Python client vs TS client vs raw HTTP; rollout throughput")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--n", type=int, default=100, help="execs per client per round")
    p.add_argument("--warm", type=int, default=10, help="untimed execs per client per round")
    p.add_argument("--cmd", default="true")
    p.add_argument("--rollout-tasks", type=int, default=4)
    p.add_argument("--rollout-group", type=int, default=8)
    p.add_argument("--rollout-runs", type=int, default=3)
    p.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    a = p.parse_args()

    server = harness.DsecServer().start()
    result: Dict[str, Any] = {"command": "python3 " + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]), "host": host_info()}
    try:
        url, key = server.url, server.api_key
        sb = dsec.Sandbox.create("busybox", memory_mib=64, url=url, api_key=key)
        clients: Dict[str, Callable[[], List[float]]] = {
            "py-raw": lambda: py_raw(url, key, sb.id, a.cmd, a.n, a.warm),
            "py-sync": lambda: py_sync(sb, a.cmd, a.n, a.warm),
            "py-async": lambda: py_async(url, key, sb.id, a.cmd, a.n, a.warm),
            "ts-raw": lambda: ts("raw", url, key, sb.id, a.cmd, a.n, a.warm),
            "ts-sdk": lambda: ts("sdk", url, key, sb.id, a.cmd, a.n, a.warm),
        }
        names = list(clients)
        samples: Dict[str, List[float]] = {k: [] for k in names}
        round_p50: Dict[str, List[float]] = {k: [] for k in names}
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                lat = clients[name]()
                samples[name] += lat
                round_p50[name].append(round(statistics.median(lat), 3))
            print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {round_p50[k][-1]:.2f}" for k in names), file=sys.stderr)
        sb.kill()
        exec_rows = {
            k: {"n": len(v), "p50_ms": round(statistics.median(v), 3), "p90_ms": round(pct(v, 90), 3), "p99_ms": round(pct(v, 99), 3), "round_p50_ms": round_p50[k]}
            for k, v in samples.items()
        }
        ts_p50 = exec_rows["ts-sdk"]["p50_ms"]
        for k in names:
            exec_rows[k]["vs_ts_sdk"] = round(exec_rows[k]["p50_ms"] / ts_p50, 3)
        result["exec"] = {"cmd": a.cmd, "rounds": a.rounds, "per_round": a.n, "clients": exec_rows}

        import rl_rollout

        runs = []
        for _ in range(a.rollout_runs):
            s = asyncio.run(rl_rollout.main_async(a.rollout_tasks, a.rollout_group, {"url": url, "api_key": key}))
            runs.append({k: s[k] for k in ("sandboxes", "wall_s", "fork_to_reward_s", "sandboxes_per_s", "left_after_kill")})
            print(f"rollout: {runs[-1]}", file=sys.stderr)
        result["rollout"] = {"tasks": a.rollout_tasks, "group": a.rollout_group, "runs": runs, "sandboxes_per_s_median": statistics.median(r["sandboxes_per_s"] for r in runs)}
    finally:
        leaks = server.stop()
    result["cleanup"] = "verified" if not leaks else leaks

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"python-{stamp}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=2)
    md = render(result)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)
    print(f"wrote {base}.json and .md", file=sys.stderr)
    return 0 if not leaks else 1


def render(r: Dict[str, Any]) -> str:
    h = r["host"]
    e = r["exec"]
    lines = [
        "# Python client: exec latency and rollout throughput",
        "",
        f"Command: `{r['command']}` (git {h['git']})  ",
        f"Host: kernel {h['kernel']}, {h['cpus']} CPUs, load {', '.join(f'{x:.2f}' for x in h['loadavg'])}; Python {h['python']}, Node {h['node']}. Cleanup: {r['cleanup']}.",
        "",
        f"## exec `{e['cmd']}`, one call at a time, {e['rounds']} rotated rounds x {e['per_round']} per client",
        "",
        "| client | p50 ms | p90 ms | p99 ms | p50 ÷ ts-sdk | per-round p50 ms |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for k, v in e["clients"].items():
        lines.append(f"| {k} | {v['p50_ms']:.2f} | {v['p90_ms']:.2f} | {v['p99_ms']:.2f} | {v['vs_ts_sdk']:.2f} | {' '.join(f'{x:.2f}' for x in v['round_p50_ms'])} |")
    ro = r["rollout"]
    lines += [
        "",
        f"## examples/rl_rollout.py: {ro['tasks']} tasks x group {ro['group']} (fork, network none, patch under writablePaths, tests, trajectory)",
        "",
        "| run | sandboxes | wall s | fork → last reward s | sandboxes/s | left after kill |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for i, run in enumerate(ro["runs"], 1):
        lines.append(f"| {i} | {run['sandboxes']} | {run['wall_s']:.2f} | {run['fork_to_reward_s']:.2f} | {run['sandboxes_per_s']:.2f} | {run['left_after_kill']} |")
    lines.append(f"\nMedian: {ro['sandboxes_per_s_median']:.2f} sandboxes/s from fork to reward.\n")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
