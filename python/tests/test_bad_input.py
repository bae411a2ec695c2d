"""Bad input through the SDK: each mistake raises the class of its registry code, with the
server's message and details, and leaves nothing half-made (the TS bad-input checks, from Python)."""

from __future__ import annotations

import unittest
import urllib.error

import dsec
import harness
from support import SKIP, conn

UNKNOWN_ID = "sb-local-0000000000000"


@unittest.skipIf(SKIP, SKIP or "")
class BadInputTest(unittest.TestCase):
    sb: dsec.Sandbox
    killed: dsec.Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = dsec.Sandbox.create("busybox", memory_mib=64, **conn())
        cls.killed = dsec.Sandbox.create("busybox", memory_mib=64, **conn())
        cls.killed.kill()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def assert_invalid(self, err: BaseException, field: str) -> None:
        self.assertIsInstance(err, dsec.InvalidRequestError)
        assert isinstance(err, dsec.InvalidRequestError)
        self.assertEqual((err.code, err.status, err.details.get("field")), ("INVALID_REQUEST", 400, field), err.message)
        self.assertTrue(err.message)

    def test_an_unknown_image_is_image_not_found_and_leaves_no_record(self) -> None:
        with self.assertRaises(dsec.NotFoundError) as cm:
            dsec.Sandbox.create("no-such-image", labels={"probe": "py-unknown-image"}, **conn())
        self.assertEqual((cm.exception.code, cm.exception.details.get("image")), ("IMAGE_NOT_FOUND", "no-such-image"))
        self.assertIn("no-such-image", cm.exception.message)
        self.assertEqual(dsec.Sandbox.list(labels={"probe": "py-unknown-image"}, **conn()), [])

    def test_resources_out_of_range_name_the_field(self) -> None:
        for kwargs, field in (({"memory_mib": 1}, "resources.memoryMiB"), ({"cpu": 0}, "resources.cpu"), ({"pids": 4}, "resources.pids")):
            with self.assertRaises(dsec.InvalidRequestError) as cm:
                dsec.Sandbox.create("busybox", **kwargs, **conn())  # type: ignore[arg-type]
            self.assert_invalid(cm.exception, field)

    def test_bad_labels_env_backend_and_network_are_invalid(self) -> None:
        for kwargs in ({"labels": {"bad key!": "x"}}, {"env": {"BAD-NAME": "x"}}, {"backend": "firecracker"}, {"network": "sideways"}):
            with self.assertRaises(dsec.InvalidRequestError, msg=str(kwargs)):
                dsec.Sandbox.create("busybox", **kwargs, **conn())  # type: ignore[arg-type]

    def test_unknown_and_killed_sandboxes_are_sandbox_not_found(self) -> None:
        with self.assertRaises(dsec.NotFoundError) as cm:
            dsec.Sandbox.connect(UNKNOWN_ID, **conn())
        self.assertEqual(cm.exception.code, "SANDBOX_NOT_FOUND")
        for call in (lambda: self.killed.commands.run("true"), lambda: self.killed.files.read("/etc/passwd")):
            with self.assertRaises(dsec.NotFoundError) as cm:
                call()
            self.assertEqual(cm.exception.code, "SANDBOX_NOT_FOUND")

    def test_kill_is_idempotent(self) -> None:
        self.killed.kill()
        dsec.Sandbox.kill_by_id(self.killed.id, **conn())
        dsec.Sandbox.kill_by_id(UNKNOWN_ID, **conn())

    def test_data_that_is_not_str_or_bytes_is_refused_before_sending(self) -> None:
        with self.assertRaises(dsec.InvalidRequestError) as cm:
            self.sb.files.write("/tmp/x", {"not": "bytes"})  # type: ignore[arg-type]
        self.assertEqual(cm.exception.details, {"field": "data"})

    def test_a_wrong_api_key_is_an_auth_error(self) -> None:
        with self.assertRaises(dsec.AuthError) as cm:
            dsec.Sandbox.list(url=harness.server().url, api_key="dsec_not-a-real-key")
        self.assertEqual((cm.exception.code, cm.exception.status), ("UNAUTHORIZED", 401))

    def test_no_api_key_is_401_unauthorized_on_the_wire(self) -> None:
        with self.assertRaises(urllib.error.HTTPError) as cm:
            harness.server().request("GET", "/v1/sandboxes", key=None)
        self.assertEqual(cm.exception.code, 401)

    def test_exec_arguments_the_schema_refuses(self) -> None:
        with self.assertRaises(dsec.InvalidRequestError) as cm:
            self.sb.commands.run("true", cwd="relative/dir")
        self.assert_invalid(cm.exception, "cwd")
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.commands.run("true", timeout=0)
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.commands.run("true", writable_paths=["not/absolute"])
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.commands.run([])

    def test_unknown_sessions_and_processes_are_not_found(self) -> None:
        with self.assertRaises(dsec.NotFoundError) as cm:
            dsec.Session(self.sb._t, self.sb.id, dsec.SessionInfo(id="ss-nosuch")).run("true")
        self.assertEqual(cm.exception.code, "SESSION_NOT_FOUND")
        with self.assertRaises(dsec.NotFoundError) as cm:
            self.sb.commands.connect("p-nosuch")
        self.assertEqual(cm.exception.code, "PROCESS_NOT_FOUND")

    def test_stdin_to_an_exited_process_is_a_conflict(self) -> None:
        p = self.sb.commands.start("true", stdin=True)
        p.wait(wait=10)
        with self.assertRaises(dsec.ConflictError):
            p.write_stdin("late")

    def test_fork_and_snapshot_arguments_the_schema_refuses(self) -> None:
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.fork(0)
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.snapshot(name="Not A Valid Name")

    def test_a_terminal_on_an_unknown_sandbox_raises_not_found(self) -> None:
        t = dsec.Terminal.open(self.sb._t, UNKNOWN_ID)
        with self.assertRaises(dsec.NotFoundError):
            t.wait(timeout=20)

    def test_a_terminal_with_a_malformed_id_is_refused(self) -> None:
        # Refused before the upgrade (the route checks its params), or by an error frame after it.
        with self.assertRaises(dsec.DsecError) as cm:
            dsec.Terminal.open(self.sb._t, "not-an-id").wait(timeout=20)
        self.assertIsInstance(cm.exception, (dsec.NotFoundError, dsec.InvalidRequestError))

    def test_a_file_path_outside_the_root_stays_inside_it(self) -> None:
        # Paths resolve inside the sandbox root: ../../ from / is / (the sandbox's, not the host's).
        self.sb.files.write("/../../tmp/escape-probe", "inside")
        self.assertEqual(self.sb.commands.run("cat /tmp/escape-probe").stdout, "inside")


if __name__ == "__main__":
    unittest.main()
