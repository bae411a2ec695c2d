"""One RL step as a trainer runs it, with a scripted policy instead of a model.

For each of M tasks: prepare a workspace (a small repository with a bug and its tests), then
fork G sandboxes from a snapshot of it (a GRPO group). In each, with the network switched to
``none`` and writes confined to the workspace's source (Landlock ``writable_paths``), the
"policy" applies one candidate patch from a fixed list (some fix the bug, some do not, one
tries to edit the tests instead); the reward is the share of the task's tests that pass. The
script prints rewards and advantages per group, the trajectory size, timings and throughput,
and kills every sandbox it made.

    python3 python/examples/rl_rollout.py --tasks 4 --group 8       # DSEC_URL/DSEC_API_KEY or client.json
    python3 python/examples/rl_rollout.py --json                     # machine-readable summary
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from a checkout

import dsec  # noqa: E402

WORKDIR = "/work"


@dataclass
class TaskSpec:
    name: str
    #: The buggy source file (path relative to the workspace) and its content.
    src_path: str
    src: str
    tests: str
    #: What the "policy" may propose: new contents for the source, or for the tests (a cheat).
    candidates: List[Dict[str, str]]


def _tests(func_file: str, cases: List[str]) -> str:
    lines = ["#!/bin/sh", f". ./{func_file}", "pass=0; total=0"]
    for case in cases:
        lines.append(f'total=$((total+1)); if {case}; then pass=$((pass+1)); else echo "FAIL: {case}" >&2; fi')
    lines.append('echo "passed $pass/$total"')
    lines.append('[ "$pass" = "$total" ]')
    return "\n".join(lines) + "\n"


def make_tasks() -> List[TaskSpec]:
    """Three bug-fix tasks in busybox sh; each has right, partly right and wrong candidate fixes."""
    add_bug = "add() {\n  echo $(($1 - $2))\n}\n"
    max_bug = "max() {\n  if [ \"$1\" -lt \"$2\" ]; then echo \"$1\"; else echo \"$2\"; fi\n}\n"
    words_bug = "count_words() {\n  printf '%s' \"$1\" | wc -c\n}\n"
    cheat = {"tests/test.sh": "#!/bin/sh\necho 'passed 1/1'\n"}
    return [
        TaskSpec(
            "add", "src/add.sh", add_bug,
            _tests("src/add.sh", ['[ "$(add 2 3)" = 5 ]', '[ "$(add 0 0)" = 0 ]', '[ "$(add -1 1)" = 0 ]', '[ "$(add 10 5)" = 15 ]']),
            [{"src/add.sh": add_bug.replace("$1 - $2", "$1 + $2")}, {"src/add.sh": add_bug.replace("$1 - $2", "$2 - $1")},
             {"src/add.sh": add_bug.replace("$1 - $2", "$1 * $2")}, cheat],
        ),
        TaskSpec(
            "max", "src/max.sh", max_bug,
            _tests("src/max.sh", ['[ "$(max 1 2)" = 2 ]', '[ "$(max 5 3)" = 5 ]', '[ "$(max 4 4)" = 4 ]', '[ "$(max -2 -7)" = -2 ]']),
            [{"src/max.sh": max_bug.replace("-lt", "-gt")}, {"src/max.sh": max_bug.replace('echo "$1"; else echo "$2"', 'echo "$2"; else echo "$1"')},
             {"src/max.sh": max_bug.replace("-lt", "-eq")}, cheat],
        ),
        TaskSpec(
            "words", "src/words.sh", words_bug,
            _tests("src/words.sh", ['[ "$(count_words "a b c")" -eq 3 ]', '[ "$(count_words "one")" -eq 1 ]', '[ "$(count_words "")" -eq 0 ]']),
            [{"src/words.sh": words_bug.replace("wc -c", "wc -w")}, {"src/words.sh": words_bug.replace("wc -c", "wc -l")}, cheat,
             {"src/words.sh": words_bug.replace("wc -c", "wc -w | tr -d ' '")}],
        ),
    ]  # fmt: skip


def unified_diff(old: Dict[str, str], new: Dict[str, str]) -> str:
    """The candidate as a patch the policy would emit (``patch -p1`` applies it)."""
    out = []
    for path, content in new.items():
        out += difflib.unified_diff(old.get(path, "").splitlines(True), content.splitlines(True), f"a/{path}", f"b/{path}")
    return "".join(out)


@dataclass
class Rollout:
    task: str
    candidate: int
    sandbox_id: str
    reward: float
    patch_exit: int
    tests_output: str
    trajectory_steps: int
    seconds: float


@dataclass
class GroupResult:
    task: str
    rollouts: List[Rollout] = field(default_factory=list)
    prepare_s: float = 0.0
    fork_s: float = 0.0
    snapshot_frozen_ms: float = 0.0


async def rollout(sb: dsec.AsyncSandbox, spec: TaskSpec, index: int) -> Rollout:
    started = time.monotonic()
    await sb.set_network("none")  # the rollout phase: loopback only
    candidate = spec.candidates[index % len(spec.candidates)]
    patch = unified_diff({spec.src_path: spec.src, "tests/test.sh": spec.tests}, candidate)
    # The policy's action: apply its patch. Only src/ (and /tmp) are writable, so a patch that
    # edits the tests fails instead of rewarding itself.
    applied = await sb.commands.run(["patch", "-p1"], stdin=patch, cwd=WORKDIR, writable_paths=[f"{WORKDIR}/src", "/tmp"], timeout=30)
    tests = await sb.commands.run(["sh", "tests/test.sh"], cwd=WORKDIR, writable_paths=["/tmp"], timeout=30)
    passed, total = 0, 1
    for line in tests.stdout.splitlines():
        if line.startswith("passed "):
            passed, total = (int(x) for x in line.split()[1].split("/"))
    trajectory = await sb.trajectory()
    return Rollout(spec.name, index % len(spec.candidates), sb.id, passed / max(total, 1), applied.exit_code, tests.stdout.strip(), len(trajectory.entries), time.monotonic() - started)


async def run_group(spec: TaskSpec, group: int, conn: Dict[str, Any], made: List[dsec.AsyncSandbox]) -> GroupResult:
    result = GroupResult(spec.name)
    t0 = time.monotonic()
    base = await dsec.AsyncSandbox.create("busybox", memory_mib=64, labels={"example": "rl-rollout", "task": spec.name}, **conn)
    made.append(base)
    await base.files.write(f"{WORKDIR}/{spec.src_path}", spec.src)
    await base.files.write(f"{WORKDIR}/tests/test.sh", spec.tests, mode=0o755)
    result.prepare_s = time.monotonic() - t0
    t1 = time.monotonic()
    fork = await base.fork(group, labels={"example": "rl-rollout", "task": spec.name, "role": "rollout"})  # snapshot + G sandboxes
    made.extend(fork.sandboxes)
    result.fork_s = time.monotonic() - t1
    result.snapshot_frozen_ms = fork.snapshot.frozen_ms
    if fork.failures:
        print(f"{spec.name}: {len(fork.failures)} forks failed: {fork.failures[0].message}", file=sys.stderr)
    result.rollouts = list(await asyncio.gather(*(rollout(sb, spec, i) for i, sb in enumerate(fork.sandboxes))))
    return result


def advantages(rewards: List[float]) -> List[float]:
    """GRPO's group-relative advantage: (r - mean) / std (0 when every reward is equal)."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [0.0 if std == 0 else (r - mean) / std for r in rewards]


async def main_async(tasks: int, group: int, conn: Dict[str, Any]) -> Dict[str, Any]:
    specs = make_tasks()
    chosen = [specs[i % len(specs)] for i in range(tasks)]
    made: List[dsec.AsyncSandbox] = []
    started = time.monotonic()
    try:
        groups = await asyncio.gather(*(run_group(s, group, conn, made) for s in chosen))
        wall = time.monotonic() - started
    finally:
        await asyncio.gather(*(sb.kill() for sb in made), return_exceptions=True)
    left = await dsec.AsyncSandbox.list(labels={"example": "rl-rollout"}, **conn)
    rollouts = [r for g in groups for r in g.rollouts]
    fork_to_reward = max(g.fork_s + max((r.seconds for r in g.rollouts), default=0.0) for g in groups)
    return {
        "tasks": tasks,
        "group": group,
        "sandboxes": len(rollouts),
        "groups": [
            {
                "task": g.task,
                "rewards": [r.reward for r in g.rollouts],
                "advantages": [round(a, 3) for a in advantages([r.reward for r in g.rollouts])],
                "candidates": [r.candidate for r in g.rollouts],
                "patch_exit_codes": [r.patch_exit for r in g.rollouts],
                "trajectory_steps": [r.trajectory_steps for r in g.rollouts],
                "prepare_s": round(g.prepare_s, 3),
                "fork_s": round(g.fork_s, 3),
                "snapshot_frozen_ms": round(g.snapshot_frozen_ms, 1),
                "rollout_s_p50": round(statistics.median(r.seconds for r in g.rollouts), 3) if g.rollouts else None,
            }
            for g in groups
        ],
        "wall_s": round(wall, 3),
        "fork_to_reward_s": round(fork_to_reward, 3),
        "sandboxes_per_s": round(len(rollouts) / fork_to_reward, 2) if fork_to_reward else None,
        "left_after_kill": len(left),
    }


def print_summary(s: Dict[str, Any]) -> None:
    print(f"RL step: {s['tasks']} tasks x group {s['group']} = {s['sandboxes']} rollouts")
    for g in s["groups"]:
        rewards = " ".join(f"{r:.2f}" for r in g["rewards"])
        print(f"  {g['task']:<6} rewards [{rewards}]  mean {statistics.fmean(g['rewards']):.2f}  prepare {g['prepare_s']:.2f}s  "
              f"fork {g['fork_s']:.2f}s (frozen {g['snapshot_frozen_ms']:.0f} ms)  rollout p50 {g['rollout_s_p50']}s")  # fmt: skip
    print(f"wall {s['wall_s']:.2f}s; fork to last reward {s['fork_to_reward_s']:.2f}s; {s['sandboxes_per_s']} sandboxes/s; left after kill: {s['left_after_kill']}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=3, help="M: tasks in the step (default 3)")
    p.add_argument("--group", type=int, default=4, help="G: rollouts per task (default 4)")
    p.add_argument("--url", help="dsec URL (default DSEC_URL or client.json)")
    p.add_argument("--api-key", help="API key (default DSEC_API_KEY or client.json)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    summary = asyncio.run(main_async(a.tasks, a.group, {"url": a.url, "api_key": a.api_key}))
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0 if summary["left_after_kill"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
