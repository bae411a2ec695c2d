"""A gym-style environment over one sandbox: ``reset(task) -> observation``,
``step(action) -> (observation, reward, done, info)``, ``close()``. No gym dependency: the
shapes follow the classic gym API so a trainer's loop (or a gymnasium wrapper) can drive it.

An episode: ``reset`` makes a sandbox (from the task's image, e.g. a snapshot of a prepared
workspace), writes the task's files, runs its setup, then switches the network to the task's
rollout policy (``none`` by default). Each ``step`` runs the agent's action confined by Landlock
to the task's ``writable_paths``; ``Submit`` (or the step budget running out) forks the agent's
final state into a fresh sandbox, writes the task's hidden tests there (``Task.tests``, into
``tests_dir``, outside anything an action may write), runs them, and kills the fork; the reward
is what ``Task.reward`` makes of their result (1.0 when they pass).

Reward hacking is the hard path by default: the tests never exist in the agent's sandbox (it can
neither read nor edit them), they run in a fork that holds the agent's files but none of its
processes (a background loop left waiting for ``/grader`` has nothing to act on), they land
where no action could write, and a task whose tests lie under a writable path (or under
``/dev``, always writable) is refused at ``reset``, also when ``tests_dir`` is a symlink in the
image that resolves to such a place.

    env = SandboxEnv()
    obs = env.reset(Task(files={"/work/a.sh": "echo $((1-1))"}, tests={"t.sh": "[ $(sh /work/a.sh) = 2 ]"}, test_cmd="sh /grader/t.sh"))
    obs, reward, done, info = env.step("sed -i 's/1-1/1+1/' a.sh")
    obs, reward, done, info = env.step(Submit())      # reward 1.0, done
    env.close()
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .models import ExecResult
from .sandbox import Sandbox


@dataclass
class Task:
    """What an episode is about. Paths are inside the sandbox."""

    #: Shown to the agent in the first observation.
    prompt: str = ""
    #: Files written at reset (the workspace), ``str`` as UTF-8.
    files: Mapping[str, Union[str, bytes]] = field(default_factory=dict)
    #: Shell commands run at reset, before the network switches to ``Task.network``.
    setup: Sequence[str] = ()
    #: The task's tests; run from ``workdir`` on Submit or when the step budget runs out.
    test_cmd: str = "true"
    #: Hidden test files (path relative to ``tests_dir``, or absolute): written only when the
    #: episode ends, just before ``test_cmd`` runs, so no action can read or change them.
    tests: Mapping[str, Union[str, bytes]] = field(default_factory=dict)
    #: Where ``tests`` are written (absolute); must not be under a writable path or /dev, also
    #: once symlinks are resolved in the sandbox (``reset`` refuses it).
    tests_dir: str = "/grader"
    workdir: str = "/work"
    #: Where actions may write (Landlock), absolute paths; None: the workdir and /tmp.
    writable_paths: Optional[Sequence[str]] = None
    #: The image to start from: a name, or the id of a snapshot holding a prepared workspace.
    image: str = "busybox"
    #: Egress policy while the agent acts: "none", "open", or {"mode": "allow", "allow": [...]}.
    network: Union[str, Mapping[str, Any]] = "none"
    max_steps: int = 20
    #: Seconds each action may run before it is killed.
    step_timeout: float = 60.0
    #: The reward from the tests' result; default 1.0 when they exit 0, else 0.0.
    reward: Optional[Callable[[ExecResult], float]] = None
    #: Anything the trainer wants back in ``info["task"]``.
    meta: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    """Run a shell command in the workdir."""

    cmd: str


@dataclass
class WriteFile:
    """Create or replace a file (as the agent's own write: confined like a command)."""

    path: str
    data: Union[str, bytes]


@dataclass
class Submit:
    """End the episode: the tests run and give the reward."""


Action = Union[str, Run, WriteFile, Submit]


@dataclass
class Observation:
    """What the agent sees after a step: the action's output and exit code."""

    output: str
    exit_code: Optional[int]
    step: int
    prompt: str = ""

    def as_dict(self) -> Dict[str, Any]:
        return {"output": self.output, "exit_code": self.exit_code, "step": self.step, "prompt": self.prompt}


def _under(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def _norm(path: str) -> str:
    """``path`` made absolute and normal: '//a/../b' is '/b' (``normpath`` alone keeps a leading '//')."""
    return posixpath.normpath("/" + path.lstrip("/"))


#: Always writable under Landlock, whatever ``writable_paths`` say: no test may live there.
ALWAYS_WRITABLE = ("/dev",)


def _default_reward(tests: ExecResult) -> float:
    return 1.0 if tests.exit_code == 0 else 0.0


class SandboxEnv:
    """One sandbox per episode; ``close()`` (or leaving a ``with``) kills it."""

    def __init__(
        self,
        *,
        memory_mib: int = 256,
        cpu: Optional[float] = None,
        labels: Optional[Mapping[str, str]] = None,
        max_output_bytes: int = 64 << 10,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> None:
        self._create_kw: Dict[str, Any] = {"memory_mib": memory_mib, "cpu": cpu, "labels": dict(labels or {}), "url": url, "api_key": api_key}
        self.max_output_bytes = max_output_bytes
        self.sandbox: Optional[Sandbox] = None
        self.task: Optional[Task] = None
        self.steps = 0
        self.done = True

    def reset(self, task: Task) -> Observation:
        """Starts an episode on ``task`` in a fresh sandbox (the previous one is killed)."""
        self.close()
        self._check_tests_protected(task)
        sb = Sandbox.create(task.image, **self._create_kw)
        self.sandbox, self.task, self.steps, self.done = sb, task, 0, False
        try:
            sb.files.mkdir(task.workdir)
            for path, data in task.files.items():
                sb.files.write(path, data)
            for cmd in task.setup:
                sb.commands.run(cmd, cwd=task.workdir, check=True)
            network = task.network
            if isinstance(network, str):
                sb.set_network(network)
            else:
                sb.set_network(str(network["mode"]), allow=network.get("allow"))
            # The image (or the setup) may make tests_dir a symlink into a writable place: what
            # counts is where the tests would land.
            self._check_tests_protected(task, resolved_tests_dir=self._resolve(sb, task.tests_dir))
            listing = sb.commands.run(["ls", "-la", task.workdir]).stdout
        except BaseException:
            self.close()
            raise
        return Observation(output=listing, exit_code=0, step=0, prompt=task.prompt)

    @staticmethod
    def _resolve(sb: Sandbox, path: str) -> str:
        """``path`` with every symlink resolved inside the sandbox (``readlink -f``, which also
        resolves a path that does not exist yet when its parent does; else the nearest ancestor
        that resolves, with the rest appended)."""
        rest: List[str] = []
        here = _norm(path)
        while True:
            r = sb.commands.run(["readlink", "-f", here])
            resolved = r.stdout.strip()
            if r.exit_code == 0 and resolved.startswith("/"):
                return _norm(posixpath.join(resolved, *reversed(rest)))
            if here == "/":
                return _norm(posixpath.join("/", *reversed(rest)))
            here, name = posixpath.split(here)
            rest.append(name)

    def _writable(self, task: Task) -> List[str]:
        return list(task.writable_paths) if task.writable_paths is not None else [task.workdir, "/tmp"]

    def _test_paths(self, task: Task) -> List[str]:
        """Where each of ``task.tests`` is written, normalised (a relative name is under tests_dir)."""
        return [_norm(p if p.startswith("/") else posixpath.join(task.tests_dir, p)) for p in task.tests]

    def _check_tests_protected(self, task: Task, resolved_tests_dir: Optional[str] = None) -> None:
        """A test an action could overwrite is a reward an agent could write itself: refused.
        Every path is checked normalised (``_norm``), against the writable paths and /dev."""
        if not isinstance(task.tests_dir, str) or not task.tests_dir.startswith("/"):
            raise ValueError(f"Task.tests_dir must be an absolute path in the sandbox (e.g. '/grader'), got {task.tests_dir!r}")
        writable = self._writable(task)
        for w in writable:
            if not isinstance(w, str) or not w.startswith("/"):
                raise ValueError(f"Task.writable_paths: each must be an absolute path in the sandbox (e.g. '/work'), got {w!r} in {writable}")
        for name in task.tests:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Task.tests: each key must be a path (relative to tests_dir, or absolute), got {name!r}")
        checked = [(p, p) for p in self._test_paths(task)] + [(task.tests_dir, _norm(task.tests_dir))]
        if resolved_tests_dir is not None:
            checked.append((f"{task.tests_dir} (resolved in the sandbox to {resolved_tests_dir})", _norm(resolved_tests_dir)))
        for shown, path in checked:
            for w in writable + list(ALWAYS_WRITABLE):
                if _under(path, _norm(w)):
                    where = f"the writable path {w}" if w in writable else f"{w} (always writable)"
                    raise ValueError(
                        f"Task.tests: {shown} is under {where}: an action could replace the tests and earn the reward; "
                        f"keep tests_dir ({task.tests_dir}) outside writable_paths ({writable}) and /dev"
                    )

    def step(self, action: Action) -> Tuple[Observation, float, bool, Dict[str, Any]]:
        """Runs one action; returns (observation, reward, done, info). The reward is 0.0 until
        the episode ends (Submit, or ``max_steps`` actions), then the tests' reward."""
        if self.sandbox is None or self.task is None or self.done:
            raise RuntimeError("call reset(task) before step(), and again after an episode is done")
        sb, task = self.sandbox, self.task
        if isinstance(action, Submit):
            return self._finish(truncated=False)
        self.steps += 1
        if isinstance(action, WriteFile):
            # Through a command, not the files API, so the write is confined like any other action.
            r = sb.commands.run(
                ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "write", action.path], stdin=action.data, cwd=task.workdir,
                writable_paths=self._writable(task), timeout=task.step_timeout, max_output_bytes=self.max_output_bytes,
            )  # fmt: skip
        else:
            cmd = action.cmd if isinstance(action, Run) else action
            r = sb.commands.run(cmd, cwd=task.workdir, writable_paths=self._writable(task), timeout=task.step_timeout, max_output_bytes=self.max_output_bytes)
        obs = Observation(output=r.stdout + r.stderr, exit_code=r.exit_code, step=self.steps, prompt=task.prompt)
        info: Dict[str, Any] = {"exit_code": r.exit_code, "timed_out": r.timed_out, "duration_ms": r.duration_ms, "sandbox_id": sb.id, "task": task.meta}
        if self.steps >= task.max_steps:
            _, reward, done, end_info = self._finish(truncated=True)
            info.update(end_info)
            return obs, reward, done, info
        return obs, 0.0, False, info

    def _finish(self, *, truncated: bool) -> Tuple[Observation, float, bool, Dict[str, Any]]:
        assert self.sandbox is not None and self.task is not None
        task = self.task
        # Graded in a fork of the agent's final state: its files, none of its processes, so
        # nothing the agent left running (a loop waiting for the tests) can see or touch them.
        graded = self.sandbox.fork(1)
        if graded.failures or not graded.sandboxes:
            for extra in graded.sandboxes:
                extra.kill()
            failure = graded.failures[0] if graded.failures else None
            reason = f"{failure.code}: {failure.message}" if failure is not None else "no sandbox came back"
            raise RuntimeError(f"could not fork sandbox {self.sandbox.id} to run the tests in: {reason}")
        grader = graded.sandboxes[0]
        try:
            # Written now, in the fork: the agent never saw them.
            for path, data in zip(self._test_paths(task), task.tests.values()):
                grader.files.write(path, data)
            tests = grader.commands.run(task.test_cmd, cwd=task.workdir, writable_paths=["/tmp"], timeout=task.step_timeout, max_output_bytes=self.max_output_bytes)
        finally:
            grader.kill()
        reward = (task.reward or _default_reward)(tests)
        self.done = True
        obs = Observation(output=tests.stdout + tests.stderr, exit_code=tests.exit_code, step=self.steps, prompt=task.prompt)
        info = {"tests": tests, "truncated": truncated, "sandbox_id": self.sandbox.id, "grader_sandbox_id": grader.id, "task": task.meta}
        return obs, reward, True, info

    def trajectory(self) -> List[Dict[str, Any]]:
        """The episode's logged steps (commands and file changes, with results), as dicts."""
        if self.sandbox is None:
            return []
        return [vars(e) for e in self.sandbox.trajectory().entries]

    def close(self) -> None:
        """Kills the episode's sandbox (idempotent)."""
        sb, self.sandbox = self.sandbox, None
        self.done = True
        if sb is not None:
            sb.kill()

    def __enter__(self) -> "SandboxEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
