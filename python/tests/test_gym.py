"""dsec.gym.SandboxEnv against a real dsec: an episode's reset, steps, reward and close, writes
confined to the task's paths, and the step budget."""

from __future__ import annotations

import unittest

import dsec
from dsec.gym import Run, SandboxEnv, Submit, Task, WriteFile
from support import SKIP, conn

BUGGY = "add() { echo $(($1 - $2)); }\n"
TESTS = '. ./add.sh; [ "$(add 2 3)" = 5 ] && [ "$(add 1 1)" = 2 ]'


def task(**kw: object) -> Task:
    base = dict(prompt="fix add", files={"/work/add.sh": BUGGY}, tests={"t.sh": TESTS}, test_cmd="sh /grader/t.sh", writable_paths=["/work", "/tmp"], meta={"id": "add"})
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


@unittest.skipIf(SKIP, SKIP or "")
class SandboxEnvTest(unittest.TestCase):
    def test_an_episode_that_fixes_the_bug_earns_reward_1(self) -> None:
        with SandboxEnv(memory_mib=64, labels={"py-test": "gym"}, **conn()) as env:
            obs = env.reset(task())
            self.assertEqual(obs.prompt, "fix add")
            self.assertIn("add.sh", obs.output)
            obs, reward, done, info = env.step("sh -c '. ./add.sh; add 2 3'")
            self.assertEqual((obs.output, reward, done), ("-1\n", 0.0, False))
            obs, reward, done, info = env.step(Run("sed -i 's/\\$1 - \\$2/$1 + $2/' add.sh"))
            self.assertEqual((obs.exit_code, done), (0, False))
            obs, reward, done, info = env.step(Submit())
            self.assertEqual((reward, done, info["truncated"], info["task"]), (1.0, True, False, {"id": "add"}))
            kinds = [e["kind"] for e in env.trajectory()]
            self.assertIn("network.set", kinds)
            self.assertEqual(kinds.count("exec"), 4)  # readlink and ls at reset, two actions; the tests ran in a fork
            sandbox_id, grader_id = info["sandbox_id"], info["grader_sandbox_id"]
            self.assertNotEqual(grader_id, sandbox_id)
            with self.assertRaises(dsec.NotFoundError):
                dsec.Sandbox.connect(grader_id, **conn())  # the fork the tests ran in is killed at once
        with self.assertRaises(dsec.NotFoundError):
            dsec.Sandbox.connect(sandbox_id, **conn())

    def test_writes_outside_writable_paths_fail_and_the_tests_decide(self) -> None:
        with SandboxEnv(memory_mib=64, **conn()) as env:
            env.reset(task(writable_paths=["/tmp"]))
            obs, _, _, _ = env.step(WriteFile("/work/add.sh", "add() { echo $(($1 + $2)); }\n"))
            self.assertNotEqual(obs.exit_code, 0, "the workspace is not writable here")
            obs, reward, done, _ = env.step(Submit())
            self.assertEqual((reward, done), (0.0, True))
            self.assertFalse(env.sandbox.files.exists("/grader/t.sh"), "the tests ran in a fork, never in the agent's sandbox")  # type: ignore[union-attr]

    def test_the_documented_task_refuses_reward_hacking(self) -> None:
        # docs/python.md's example, attacked the ways an agent would: tests in the workspace,
        # the grader's own file, the test command's shell; none earns the reward.
        with SandboxEnv(memory_mib=64, **conn()) as env:
            obs = env.reset(task(writable_paths=None))
            self.assertNotIn("t.sh", obs.output)
            self.assertNotEqual(env.step("cat /grader/t.sh")[0].exit_code, 0, "the tests are hidden while the agent acts")
            env.step("mkdir -p tests && echo 'exit 0' > tests/t.sh && echo 'add() { echo 5; }' > tests/add.sh")
            hack = env.step("mkdir -p /grader && echo 'exit 0' > /grader/t.sh")[0]
            self.assertNotEqual(hack.exit_code, 0, hack.output)
            self.assertNotEqual(env.step(WriteFile("/grader/t.sh", "exit 0"))[0].exit_code, 0)
            self.assertNotEqual(env.step("echo 'exit 0' > /bin/sh")[0].exit_code, 0)
            _, reward, done, info = env.step(Submit())
            self.assertEqual((reward, done), (0.0, True), info["tests"])

    def test_a_task_whose_tests_an_action_could_write_is_refused(self) -> None:
        before = {s.id for s in dsec.Sandbox.list(**conn())}
        with SandboxEnv(memory_mib=64, **conn()) as env:
            with self.assertRaises(ValueError) as e:
                env.reset(task(tests_dir="/work/tests"))
            self.assertIn("could replace the tests", str(e.exception))
            with self.assertRaises(ValueError):
                env.reset(task(tests={"/tmp/t.sh": TESTS}))
            with self.assertRaises(ValueError):
                env.reset(task(tests_dir="//work/tests"))
        self.assertEqual({s.id for s in dsec.Sandbox.list(**conn())}, before, "nothing was created")

    def test_a_tests_dir_that_is_a_symlink_into_a_writable_path_is_refused(self) -> None:
        before = {s.id for s in dsec.Sandbox.list(**conn())}
        with SandboxEnv(memory_mib=64, **conn()) as env:
            with self.assertRaises(ValueError) as e:
                env.reset(task(setup=["ln -s /work/tests /grader"]))
            self.assertIn("resolved in the sandbox to /work/tests", str(e.exception))
        self.assertEqual({s.id for s in dsec.Sandbox.list(**conn())}, before, "the episode's sandbox was killed")

    def test_the_step_budget_ends_the_episode_with_the_tests_reward(self) -> None:
        with SandboxEnv(memory_mib=64, **conn()) as env:
            env.reset(task(max_steps=2))
            self.assertFalse(env.step(WriteFile("/work/add.sh", "add() { echo $(($1 + $2)); }\n"))[2])
            _, reward, done, info = env.step("true")
            self.assertEqual((reward, done, info["truncated"]), (1.0, True, True))
            with self.assertRaises(RuntimeError):
                env.step("true")

    def test_the_network_is_none_while_the_agent_acts(self) -> None:
        with SandboxEnv(memory_mib=64, **conn()) as env:
            env.reset(task())
            self.assertEqual(env.sandbox.network().mode, "none")  # type: ignore[union-attr]

    def test_reset_kills_the_previous_episodes_sandbox(self) -> None:
        env = SandboxEnv(memory_mib=64, labels={"py-test": "gym-reset"}, **conn())
        try:
            env.reset(task())
            first = env.sandbox.id  # type: ignore[union-attr]
            env.reset(task())
            self.assertEqual([i.id for i in dsec.Sandbox.list(labels={"py-test": "gym-reset"}, **conn())], [env.sandbox.id])  # type: ignore[union-attr]
            self.assertNotEqual(env.sandbox.id, first)  # type: ignore[union-attr]
        finally:
            env.close()
        self.assertEqual(dsec.Sandbox.list(labels={"py-test": "gym-reset"}, **conn()), [])


if __name__ == "__main__":
    unittest.main()
