"""dsec.fn against a real dsec: one call with stdin, files and args; a batch through fn.map in call
order; bad input refused before anything is sent; an unknown image as NotFoundError."""

from __future__ import annotations

import os
import unittest

import dsec
import harness
from support import SKIP, conn

NO_PYTHON = None if os.path.exists("/usr/bin/python3") else "the fn-runtime image copies /usr/bin/python3 from the host"


@unittest.skipIf(SKIP or NO_PYTHON, SKIP or NO_PYTHON or "")
class FnTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        harness.server().request("POST", "/v1/images", {"builder": "fn-runtime"}, timeout=600)

    def test_a_call_gets_stdin_files_and_args_and_returns_output_and_exit_code(self) -> None:
        r = dsec.fn.run(
            "python",
            "import sys\nprint(open('data/n.txt').read().strip(), sys.argv[1], sys.stdin.read())\nsys.exit(4)",
            stdin="in",
            files={"data/n.txt": "41"},
            args=["arg"],
            timeout=20,
            **conn(),
        )
        self.assertEqual((r.exit_code, r.stdout, r.timed_out, r.worker_replaced), (4, "41 arg in\n", False, False))
        self.assertGreater(r.duration, 0)

    def test_map_returns_results_in_call_order(self) -> None:
        calls = [{"runtime": "python", "code": f"print({i} * 2)"} for i in range(6)] + [{"runtime": "bash", "code": 'echo "$1"', "args": ["sh"]}]
        rs = dsec.fn.map(calls, concurrency=3, **conn())
        self.assertEqual([r.stdout for r in rs], [f"{i * 2}\n" for i in range(6)] + ["sh\n"])
        seen = sorted(o.index for o in dsec.fn.map_iter(calls[:3], **conn()))
        self.assertEqual(seen, [0, 1, 2])

    def test_bad_input_is_refused_and_an_unknown_image_is_not_found(self) -> None:
        with self.assertRaises(dsec.InvalidRequestError):
            dsec.fn.run("ruby", "puts 1", **conn())
        with self.assertRaises(dsec.NotFoundError):
            dsec.fn.run("python", "print(1)", image="no-such-image", **conn())


if __name__ == "__main__":
    unittest.main()
