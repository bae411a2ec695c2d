"""Runs the Python SDK's tests: unit tests, then integration tests against one real dsec that
this script starts (tests/harness.py) and stops with a leak check. Exit status: 0 when every
test passed (skips allowed) and nothing leaked.

    python3 python/tests/run.py [-k pattern]
"""

from __future__ import annotations

import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the dsec package, from this checkout
sys.path.insert(0, HERE)

import harness  # noqa: E402


def _exit_on_signal(signum: int, _frame: object) -> None:
    # unittest lets KeyboardInterrupt end the run (other exceptions only fail the current test);
    # main's finally then kills the sandboxes and stops the server.
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    status = 1
    try:
        status = run()
    except KeyboardInterrupt as stop:
        print(f"python tests interrupted ({stop}); stopping dsec", file=sys.stderr)
    finally:
        leaks = harness.shared_server_stop()  # a no-op when run() stopped it already
        if leaks:
            print("the Python tests leaked:\n  " + "\n  ".join(leaks), file=sys.stderr)
    return 1 if leaks else status


def run() -> int:
    started = time.monotonic()
    patterns = sys.argv[sys.argv.index("-k") + 1 :: 2] if "-k" in sys.argv else None
    loader = unittest.TestLoader()
    if patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in patterns]
    suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    leaks = harness.shared_server_stop()
    if leaks:
        print("the Python tests leaked:\n  " + "\n  ".join(leaks), file=sys.stderr)
    print(f"python tests: {result.testsRun} run in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0 if result.wasSuccessful() and not leaks else 1


if __name__ == "__main__":
    sys.exit(main())
