"""examples/rl_rollout.py end to end against a real dsec (small M and G): rewards as the
candidates deserve, the cheating patch refused by Landlock, and nothing left after."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import unittest

from support import SKIP, conn

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "rl_rollout.py")


def load_example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rl_rollout", EXAMPLE)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rl_rollout"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@unittest.skipIf(SKIP, SKIP or "")
class RolloutExampleTest(unittest.TestCase):
    def test_one_rl_step_of_2_tasks_by_4_rollouts(self) -> None:
        ex = load_example()
        s = asyncio.run(ex.main_async(2, 4, conn()))
        self.assertEqual((s["sandboxes"], s["left_after_kill"]), (8, 0))
        add, mx = s["groups"]
        # Candidate 0 fixes the bug; the others pass only some tests; candidate 3 edits the tests
        # (refused: only src/ is writable), so the buggy code is what gets tested.
        self.assertEqual(add["rewards"], [1.0, 0.25, 0.25, 0.25])
        self.assertEqual(mx["rewards"], [1.0, 1.0, 0.5, 0.25])
        self.assertEqual(add["patch_exit_codes"][:3], [0, 0, 0])
        self.assertNotEqual(add["patch_exit_codes"][3], 0)
        self.assertEqual(add["advantages"][0], round((1.0 - 0.4375) / 0.3247595264191645, 3))
        self.assertTrue(all(n >= 3 for n in add["trajectory_steps"]), add["trajectory_steps"])  # network, patch, tests
        self.assertGreater(s["sandboxes_per_s"], 0)


if __name__ == "__main__":
    unittest.main()
