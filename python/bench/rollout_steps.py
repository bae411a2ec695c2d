"""The Python SDK's side of ``dsec bench rollout`` (packages/bench/src/scenarios/rollout-python.ts):
one asyncio event loop driving N sandboxes through ``dsec.AsyncSandbox``, each running its agent
steps one after the other, all sandboxes at once, as a Python trainer's rollout workers do.

It speaks JSON lines: one request on stdin, one answer on stdout.
  {"op": "connect", "url": ..., "apiKey": ..., "ids": [...]}  -> {"ok": true, "python": "3.11.2"}
  {"op": "run", "plans": [[plan, ...], ...]}                  -> {"wallMs": ..., "clientCpuMs": ..., "outcomes": [[outcome | {"error": ...}, ...], ...]}
  {"op": "close"}                                             -> exits
A plan is rollout-step.ts's StepPlan; an outcome its StepOutcome (timings in ms, every command's
stdout and the file read back): the bench checks the answers, not this script.
"""

from __future__ import annotations

import asyncio
import json
import platform
import sys
import time
from typing import Any, Dict, List

import dsec


async def step(sb: dsec.AsyncSandbox, plan: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    await sb.files.write(plan["writePath"], plan["content"])
    write_ms = (time.perf_counter() - t0) * 1000
    outputs: List[str] = []
    command_ms: List[float] = []
    for cmd in plan["commands"]:
        t = time.perf_counter()
        outputs.append((await sb.commands.run(cmd)).stdout)
        command_ms.append((time.perf_counter() - t) * 1000)
    t1 = time.perf_counter()
    read = await sb.files.read_text(plan["readPath"])
    t2 = time.perf_counter()
    return {"ms": (t2 - t0) * 1000, "writeMs": write_ms, "commandMs": command_ms, "readMs": (t2 - t1) * 1000, "outputs": outputs, "read": read}


async def loop(sb: dsec.AsyncSandbox, plans: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for plan in plans:
        try:
            out.append(await step(sb, plan))
        except Exception as err:  # noqa: BLE001 - every failure is reported back, the loop goes on
            out.append({"error": f"{type(err).__name__}: {err}"})
    return out


async def main() -> None:
    sandboxes: List[dsec.AsyncSandbox] = []
    loop_ = asyncio.get_running_loop()
    while True:
        line = await loop_.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        req = json.loads(line)
        if req["op"] == "connect":
            sandboxes = list(await asyncio.gather(*(dsec.AsyncSandbox.connect(i, url=req["url"], api_key=req["apiKey"]) for i in req["ids"])))
            answer: Dict[str, Any] = {"ok": True, "python": platform.python_version()}
        elif req["op"] == "run":
            plans = req["plans"]
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            outcomes = await asyncio.gather(*(loop(sb, plans[i]) for i, sb in enumerate(sandboxes[: len(plans)])))
            cpu_ms = (time.process_time() - cpu0) * 1000
            answer = {"wallMs": (time.perf_counter() - t0) * 1000, "clientCpuMs": cpu_ms, "outcomes": outcomes}
        else:
            return
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
