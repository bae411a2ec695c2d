"""The sync client against a real dsec: every call of the surface, for real (crun, EROFS,
overlayfs, cgroups, nftables, Landlock)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
import time
import unittest

import dsec
import harness
from support import SKIP, cgroup_exists, conn, live, mounts_of


@unittest.skipIf(SKIP, SKIP or "")
class CommandsTest(unittest.TestCase):
    sb: dsec.Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = dsec.Sandbox.create("busybox", memory_mib=128, **conn())

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def test_run_returns_exit_code_stdout_and_stderr(self) -> None:
        r = self.sb.commands.run("echo out; echo err >&2; exit 3")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.ok), (3, "out\n", "err\n", False))

    def test_a_command_carries_its_cpu_time_memory_peak_and_wait(self) -> None:
        busy = self.sb.commands.run("i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done")
        idle = self.sb.commands.run("true")
        self.assertIsNotNone(busy.cpu_ms)
        self.assertGreater(busy.cpu_ms, 50)
        self.assertLess(idle.cpu_ms, busy.cpu_ms / 4)
        self.assertIsInstance(busy.peak_memory_bytes, int)
        self.assertGreaterEqual(busy.queued_ms, 0)
        usage = self.sb.refresh().usage or {}
        self.assertGreater(usage.get("cpuMs", 0), busy.cpu_ms / 2)
        self.assertIn("diskBytes", usage)

    def test_run_an_argv_with_cwd_and_env(self) -> None:
        r = self.sb.commands.run(["sh", "-c", 'echo "$PWD $GREETING"'], cwd="/tmp", env={"GREETING": "hello there"})
        self.assertEqual(r.stdout, "/tmp hello there\n")

    def test_stdin_as_text_and_as_bytes_and_binary_output(self) -> None:
        self.assertEqual(self.sb.commands.run("cat", stdin="text in").stdout, "text in")
        data = bytes(range(256))
        r = self.sb.commands.run("cat", stdin=data, binary=True)
        self.assertEqual(r.stdout, data)
        self.assertIsInstance(r.stdout, bytes)

    def test_check_raises_command_exit_error_with_the_output(self) -> None:
        with self.assertRaises(dsec.CommandExitError) as cm:
            self.sb.commands.run("echo why; exit 2", check=True)
        self.assertEqual((cm.exception.exit_code, cm.exception.stdout), (2, "why\n"))

    def test_a_command_past_its_timeout_is_killed_and_says_timed_out(self) -> None:
        r = self.sb.commands.run("sleep 30", timeout=0.5)
        self.assertTrue(r.timed_out)
        self.assertNotEqual(r.exit_code, 0)

    def test_an_uncapped_stream_sends_every_byte(self) -> None:
        events = list(self.sb.commands.stream("head -c 5000 /dev/zero", max_output_bytes=100, uncapped=True))
        self.assertEqual(sum(len(e.data) for e in events if isinstance(e, dsec.OutputEvent)), 5000)

    def test_output_past_max_output_bytes_is_counted_not_kept(self) -> None:
        r = self.sb.commands.run("head -c 5000 /dev/zero", max_output_bytes=100, binary=True)
        self.assertTrue(r.truncated)
        self.assertEqual((len(r.stdout), r.stdout_total), (100, 5000))

    def test_stream_yields_output_as_produced_then_the_exit_status(self) -> None:
        events = list(self.sb.commands.stream("echo a; echo b >&2; sleep 0.2; echo c; exit 5"))
        out = b"".join(e.data for e in events if isinstance(e, dsec.OutputEvent) and e.stream == "stdout")
        err = b"".join(e.data for e in events if isinstance(e, dsec.OutputEvent) and e.stream == "stderr")
        self.assertEqual((out, err), (b"a\nc\n", b"b\n"))
        self.assertIsInstance(events[-1], dsec.ExitEvent)
        self.assertEqual(events[-1].exit_code, 5)  # type: ignore[union-attr]

    def test_leaving_a_stream_early_kills_the_command(self) -> None:
        stream = self.sb.commands.stream("echo started; exec sleep 4242")
        first = next(iter(stream))
        self.assertIsInstance(first, dsec.OutputEvent)
        self.assertTrue(harness.wait_until(lambda: live(self.sb, r"^sleep 4242")), "sleep 4242 started")
        stream.close()  # type: ignore[attr-defined]
        self.assertTrue(harness.wait_until(lambda: not live(self.sb, r"^sleep 4242")), "the command died with the stream")

    def test_sessions_keep_cwd_env_and_variables_and_survive_a_timeout(self) -> None:
        with self.sb.sessions.create() as s:
            s.run("cd /tmp && export X=1 && Y=2")
            r = s.run('echo "$PWD $X $Y"')
            self.assertEqual((r.stdout, r.session_alive), ("/tmp 1 2\n", True))
            r = s.run("sleep 30", timeout=0.3)
            self.assertTrue(r.timed_out)
            self.assertEqual(s.run("echo $PWD").stdout, "/tmp\n")
            self.assertIn(s.id, [x.id for x in self.sb.sessions.list()])
        with self.assertRaises(dsec.DsecError) as cm:
            s.run("true")
        self.assertIn(cm.exception.code, ("SESSION_NOT_FOUND", "SESSION_CLOSED"))

    def test_a_background_process_with_stdin_wait_and_output(self) -> None:
        p = self.sb.commands.start("cat; echo done >&2", stdin=True)
        self.assertEqual(p.info.status, "running")
        p.write_stdin("line 1\n")
        p.write_stdin(b"line 2\n", eof=True)
        info = p.wait(wait=10)
        self.assertEqual((info.status, info.exit_code), ("exited", 0))
        out = p.output()
        self.assertEqual((out.stdout, out.stderr), (b"line 1\nline 2\n", b"done\n"))
        self.assertEqual(p.output(stdout_offset=7).stdout, b"line 2\n")
        self.assertIn(p.id, [x.id for x in self.sb.commands.list()])
        self.assertEqual(self.sb.commands.connect(p.id).info.exit_code, 0)

    def test_follow_streams_a_process_output_until_it_exits(self) -> None:
        p = self.sb.commands.start("for i in 1 2 3; do echo $i; sleep 0.1; done")
        self.assertEqual(b"".join(e.data for e in p.follow(poll=0.1)), b"1\n2\n3\n")
        self.assertEqual(p.info.status, "exited")

    def test_signals_and_kill_end_a_process(self) -> None:
        p = self.sb.commands.start("exec sleep 777")
        p.signal("SIGTERM")
        self.assertEqual(p.wait(wait=10).status, "exited")
        q = self.sb.commands.start("exec sleep 778")
        q.kill()
        self.assertEqual(q.wait(wait=10).status, "exited")
        self.assertFalse(live(self.sb, r"^sleep 77[78]"))

    def test_writable_paths_confine_a_commands_writes(self) -> None:
        self.sb.commands.run("mkdir -p /work/src /work/tests && echo orig > /work/tests/t", check=True)
        r = self.sb.commands.run("echo new > /work/src/a && echo hacked > /work/tests/t", writable_paths=["/work/src"])
        self.assertNotEqual(r.exit_code, 0)
        self.assertEqual(self.sb.files.read_text("/work/src/a"), "new\n")
        self.assertEqual(self.sb.files.read_text("/work/tests/t"), "orig\n")


@unittest.skipIf(SKIP, SKIP or "")
class FilesTest(unittest.TestCase):
    sb: dsec.Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = dsec.Sandbox.create("busybox", memory_mib=64, **conn())

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def test_write_read_stat_and_mode(self) -> None:
        f = self.sb.files
        self.assertEqual(f.write("/data/a b.bin", bytes([0, 1, 255]), mode=0o750).bytes, 3)
        self.assertEqual(f.read("/data/a b.bin"), bytes([0, 1, 255]))
        st = f.stat("/data/a b.bin")
        self.assertEqual((st.type, st.size, st.mode, st.name), ("file", 3, "0750", "a b.bin"))
        f.write("/data/t.txt", "é\n")
        self.assertEqual(f.read_text("/data/t.txt"), "é\n")
        self.assertEqual(f.read("/data/t.txt"), "é\n".encode())

    def test_list_mkdir_rename_remove_exists(self) -> None:
        f = self.sb.files
        f.mkdir("/d1/sub/deeper")
        f.write("/d1/x", "x")
        self.assertEqual(sorted(e.name for e in f.list("/d1").entries), ["sub", "x"])
        f.rename("/d1/x", "/d1/y")
        self.assertFalse(f.exists("/d1/x"))
        self.assertTrue(f.exists("/d1/y"))
        with self.assertRaises(dsec.DsecError):
            f.remove("/d1")  # not empty, not recursive
        f.remove("/d1", recursive=True)
        self.assertFalse(f.exists("/d1"))

    def test_a_missing_file_raises_not_found_error(self) -> None:
        with self.assertRaises(dsec.NotFoundError) as cm:
            self.sb.files.read("/no/such/file")
        self.assertEqual(cm.exception.code, "FILE_NOT_FOUND")

    def test_tar_upload_and_download_round_trip(self) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in (("top.txt", b"top"), ("sub/inner.txt", b"inner")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        self.sb.files.upload_tar("/up", buf.getvalue())
        self.assertEqual(self.sb.files.read("/up/sub/inner.txt"), b"inner")
        with tarfile.open(fileobj=io.BytesIO(self.sb.files.download_tar("/up")), mode="r") as tar:
            names = set(tar.getnames())
        self.assertTrue({"up/top.txt", "up/sub/inner.txt"} <= names, names)

    def test_upload_dir_and_download_dir_copy_a_local_tree(self) -> None:
        src, dst = tempfile.mkdtemp(), tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(src, "pkg"))
            with open(os.path.join(src, "pkg", "m.py"), "w") as fh:
                fh.write("x = 1\n")
            self.sb.files.upload_dir(src, "/ws")
            self.assertEqual(self.sb.files.read_text("/ws/pkg/m.py"), "x = 1\n")
            self.sb.files.download_dir("/ws", dst)
            with open(os.path.join(dst, "ws", "pkg", "m.py")) as fh:
                self.assertEqual(fh.read(), "x = 1\n")
        finally:
            shutil.rmtree(src)
            shutil.rmtree(dst)


@unittest.skipIf(SKIP, SKIP or "")
class StateTest(unittest.TestCase):
    """Lifecycle and state: context managers, pause, snapshot, fork, network, trajectory, replay."""

    def test_the_context_manager_kills_the_sandbox_and_nothing_is_left(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            self.assertEqual(sb.info.status, "running")
            self.assertTrue(cgroup_exists(sb.id))
            self.assertTrue(mounts_of(sb.id))
        with self.assertRaises(dsec.NotFoundError):
            dsec.Sandbox.connect(sb.id, **conn())
        self.assertFalse(cgroup_exists(sb.id), "cgroup removed")
        self.assertEqual(mounts_of(sb.id), [], "mounts removed")

    def test_pause_refuses_commands_until_resume(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            self.assertEqual(sb.pause().status, "paused")
            with self.assertRaises(dsec.ConflictError) as cm:
                sb.commands.run("true")
            self.assertEqual(cm.exception.code, "SANDBOX_NOT_RUNNING")
            self.assertEqual(sb.resume().status, "running")
            self.assertEqual(sb.commands.run("echo back").stdout, "back\n")

    def test_snapshot_restore_and_fork_carry_the_state(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            sb.files.write("/work/state.txt", "step 3\n")
            snap = sb.snapshot()
            self.assertTrue(snap.image_id.startswith("sha256:"))
            self.assertTrue(snap.layer_added)
            with dsec.Sandbox.create(snap.image_id, memory_mib=64, **conn()) as restored:
                self.assertEqual(restored.files.read_text("/work/state.txt"), "step 3\n")
            fork = sb.fork(2, labels={"py-test": "fork"})
            try:
                self.assertEqual((len(fork.sandboxes), fork.failures), (2, []))
                for child in fork.sandboxes:
                    self.assertEqual(child.commands.run("cat /work/state.txt").stdout, "step 3\n")
                listed = {i.id for i in dsec.Sandbox.list(labels={"py-test": "fork"}, **conn())}
                self.assertEqual(listed, {c.id for c in fork.sandboxes})
            finally:
                for child in fork.sandboxes:
                    child.kill()

    def test_the_network_policy_switches_at_runtime(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, network="none", **conn()) as sb:
            self.assertEqual(sb.network().mode, "none")
            st = sb.set_network("allow", allow=["169.254.77.1:80"])
            self.assertEqual(st.mode, "allow")
            self.assertEqual(st.allow, [{"cidr": "169.254.77.1/32", "port": 80}])
            self.assertIsNotNone(st.applied_ms)
            self.assertEqual(sb.set_network("none").mode, "none")
            self.assertEqual(sb.network().mode, "none")

    def test_the_trajectory_logs_each_step_and_replay_rebuilds_the_sandbox(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            sb.files.write("/work/a.txt", "a\n")
            sb.commands.run("cat /work/a.txt > /work/b.txt")
            traj = sb.trajectory()
            kinds = [e.kind for e in traj.entries]
            self.assertEqual(kinds, ["files.write", "exec"])
            self.assertEqual(traj.entries[1].exit_code, 0)
            self.assertEqual([e.seq for e in sb.trajectory(after_seq=1).entries], [2])
            copy, report = sb.replay()
            with copy:
                self.assertEqual((report.replayed, report.diverged, report.skipped), (2, 0, 0))
                self.assertEqual(copy.files.read_text("/work/b.txt"), "a\n")

    def test_a_terminal_has_the_size_asked_for_and_returns_the_exit_code(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            with sb.terminal(cmd=["/bin/sh"], cols=100, rows=30) as t:
                t.write("stty size\r")
                seen = b""
                while b"30 100" not in seen:
                    chunk = t.read(timeout=20)
                    self.assertIsNotNone(chunk, f"terminal ended early: {seen!r}")
                    seen += chunk or b""
                t.resize(120, 40)
                t.write("stty size; exit 7\r")
                rest = b"".join(t)
                self.assertIn(b"40 120", rest)
                self.assertEqual(t.wait(timeout=20), 7)

    def test_killing_a_terminal_kills_its_command(self) -> None:
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            t = sb.terminal(cmd=["/bin/sh", "-c", "exec sleep 5150"])
            self.assertTrue(harness.wait_until(lambda: live(sb, r"^sleep 5150")))
            t.kill()
            self.assertTrue(harness.wait_until(lambda: not live(sb, r"^sleep 5150")), "the command died with the terminal")

    def test_nodes_lists_this_servers_edge(self) -> None:
        self.assertIn(harness.server().edge_id, [n.id for n in dsec.nodes(**conn())])


@unittest.skipIf(SKIP, SKIP or "")
class ListingTest(unittest.TestCase):
    """A listing a page at a time, the server's counts, and a bulk kill that reports its progress."""

    def test_pages_iterate_counts_and_kill_all_with_progress(self) -> None:
        made = [dsec.Sandbox.create("busybox", memory_mib=64, labels={"py-test": "pages"}, **conn()) for _ in range(5)]
        try:
            ids = [sb.id for sb in made]
            first = dsec.Sandbox.list_page(labels={"py-test": "pages"}, limit=2, **conn())
            self.assertEqual(len(first.sandboxes), 2)
            self.assertIsNotNone(first.next)
            second = dsec.Sandbox.list_page(labels={"py-test": "pages"}, limit=2, after=first.next, **conn())
            third = dsec.Sandbox.list_page(labels={"py-test": "pages"}, limit=2, after=second.next, **conn())
            self.assertEqual((len(third.sandboxes), third.next), (1, None))
            paged = [s.id for p in (first, second, third) for s in p.sandboxes]
            self.assertEqual(sorted(paged), sorted(ids))
            self.assertEqual([s.id for s in dsec.Sandbox.iterate(labels={"py-test": "pages"}, page_size=2, **conn())], paged)
            newest = dsec.Sandbox.list_page(labels={"py-test": "pages"}, limit=3, order="newest", **conn())
            older = dsec.Sandbox.list_page(labels={"py-test": "pages"}, limit=3, order="newest", after=newest.next, **conn())
            self.assertEqual([s.id for p in (newest, older) for s in p.sandboxes], paged[::-1])
            with self.assertRaises(dsec.InvalidRequestError):
                dsec.Sandbox.list_page(limit=2, order="sideways", **conn())
            counts = dsec.Sandbox.counts(**conn())
            self.assertGreaterEqual(counts.counts.get("running", 0), 5)
            self.assertEqual(counts.total, sum(counts.counts.values()))
            with self.assertRaises(dsec.InvalidRequestError):
                dsec.Sandbox.list_page(limit=0, **conn())
            lines: list = []
            result = dsec.Sandbox.kill_all(labels={"py-test": "pages"}, on_progress=lines.append, **conn())
            self.assertEqual((sorted(result.ids), result.failures), (sorted(ids), []))
            self.assertEqual(lines[-1]["type"], "done")
            self.assertTrue(all(line["total"] == 5 for line in lines))
            self.assertEqual(dsec.Sandbox.list(labels={"py-test": "pages"}, **conn()), [])
        finally:
            for sb in made:
                try:
                    sb.kill()
                except dsec.NotFoundError:
                    pass


@unittest.skipIf(SKIP, SKIP or "")
class CreateManyTest(unittest.TestCase):
    """create_many and iter_create_many over the batch API (POST /v1/batches + its NDJSON progress)."""

    def test_create_many_makes_count_sandboxes_of_one_spec_as_one_batch(self) -> None:
        batch = dsec.Sandbox.create_many(3, concurrency=2, memory_mib=64, labels={"py-test": "many"}, **conn())
        try:
            self.assertEqual((len(batch.sandboxes), batch.failures), (3, []))
            self.assertTrue(batch.batch_id.startswith("batch-"))
            self.assertEqual({i.id for i in dsec.Sandbox.list(labels={"py-test": "many"}, **conn())}, {s.id for s in batch.sandboxes})
            self.assertTrue(all(s.info.resources.memory_mib == 64 and s.info.labels["dsec.batch"] == batch.batch_id for s in batch.sandboxes))
            self.assertEqual(batch.sandboxes[0].commands.run("echo from-a-batch").stdout, "from-a-batch\n")
            info = dsec.Sandbox.batch_info(batch.batch_id, **conn())
            self.assertEqual((info.state, info.running, info.failed, info.placed), ("done", 3, 0, 3))
        finally:
            for sb in batch.sandboxes:
                sb.kill()

    def test_progress_counts_up_event_by_event_and_each_running_item_is_a_sandbox(self) -> None:
        steps = list(dsec.Sandbox.iter_create_many(3, memory_mib=64, labels={"py-test": "iter"}, **conn()))
        try:
            self.assertEqual((steps[0].event, steps[-1].event, steps[-1].done), ("accepted", "done", True))
            self.assertEqual([s.seq for s in steps], list(range(len(steps))))
            running = [s for s in steps if s.event == "running"]
            self.assertEqual(sorted(s.index for s in running), [0, 1, 2])  # type: ignore[type-var]
            self.assertTrue(all(s.sandbox is not None and s.sandbox.info.status == "running" for s in running))
            self.assertEqual((steps[-1].running, steps[-1].placed, steps[-1].failed, steps[-1].total), (3, 3, 0, 3))
        finally:
            for s in steps:
                if s.sandbox is not None:
                    s.sandbox.kill()

    def test_a_bad_spec_is_refused_before_anything_is_made(self) -> None:
        with self.assertRaises(dsec.NotFoundError) as cm:
            dsec.Sandbox.create_many(2, image="no-such-image", labels={"py-test": "bad-batch"}, **conn())
        self.assertEqual(cm.exception.code, "IMAGE_NOT_FOUND")
        with self.assertRaises(dsec.InvalidRequestError):
            dsec.Sandbox.create_many(0, **conn())
        self.assertEqual(dsec.Sandbox.list(labels={"py-test": "bad-batch"}, **conn()), [])

    def test_stopping_early_cancels_the_batch_and_kills_what_it_made(self) -> None:
        steps = dsec.Sandbox.iter_create_many(4, concurrency=1, memory_mib=64, labels={"py-test": "early"}, **conn())
        first = next(s for s in steps if s.sandbox is not None)
        steps.close()  # type: ignore[attr-defined]
        self.assertEqual(dsec.Sandbox.batch_info(first.batch_id, **conn()).state, "cancelled")
        gone = harness.wait_until(lambda: dsec.Sandbox.list(labels={"py-test": "early"}, **conn()) == [])
        self.assertTrue(gone, "the cancelled batch's sandboxes were killed")


if __name__ == "__main__":
    unittest.main()
