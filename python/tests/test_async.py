"""The asyncio client against a real dsec: the same surface with await, concurrency on one event
loop, and cancellation (a cancelled task's command is killed)."""

from __future__ import annotations

import asyncio
import unittest

import dsec
import harness
from support import SKIP, conn, live


@unittest.skipIf(SKIP, SKIP or "")
class AsyncSandboxTest(unittest.IsolatedAsyncioTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        conn()  # starts the shared server here, not inside the event loop

    async def asyncSetUp(self) -> None:
        self.sb = await dsec.AsyncSandbox.create("busybox", memory_mib=128, labels={"py-test": "async"}, **conn())

    async def asyncTearDown(self) -> None:
        try:
            await self.sb.kill()
        except dsec.NotFoundError:
            pass

    async def test_pages_counts_and_kill_all_with_progress(self) -> None:
        made = [await dsec.AsyncSandbox.create("busybox", memory_mib=64, labels={"py-test": "apages"}, **conn()) for _ in range(3)]
        ids = sorted(sb.id for sb in made)
        page = await dsec.AsyncSandbox.list_page(labels={"py-test": "apages"}, limit=2, **conn())
        self.assertEqual((len(page.sandboxes), page.next is not None), (2, True))
        self.assertEqual(sorted([s.id async for s in dsec.AsyncSandbox.iterate(labels={"py-test": "apages"}, page_size=2, **conn())]), ids)
        self.assertGreaterEqual((await dsec.AsyncSandbox.counts(**conn())).counts.get("running", 0), 3)
        lines: list = []
        result = await dsec.AsyncSandbox.kill_all(labels={"py-test": "apages"}, on_progress=lines.append, **conn())
        self.assertEqual(sorted(result.ids), ids)
        self.assertEqual(lines[-1]["type"], "done")

    async def test_run_stream_and_concurrent_commands(self) -> None:
        r = await self.sb.commands.run("echo hi; exit 4")
        self.assertEqual((r.exit_code, r.stdout), (4, "hi\n"))
        events = [ev async for ev in self.sb.commands.stream("echo a; sleep 0.1; echo b")]
        self.assertEqual(b"".join(e.data for e in events if isinstance(e, dsec.OutputEvent)), b"a\nb\n")
        self.assertEqual(events[-1].exit_code, 0)  # type: ignore[union-attr]
        results = await asyncio.gather(*(self.sb.commands.run(f"sleep 0.3; echo {i}") for i in range(8)))
        self.assertEqual([x.stdout for x in results], [f"{i}\n" for i in range(8)])

    async def test_cancelling_a_task_kills_its_command(self) -> None:
        task = asyncio.ensure_future(self.sb.commands.run("exec sleep 6161"))
        ok = await asyncio.to_thread(harness.wait_until, lambda: live(dsec.Sandbox.connect(self.sb.id, **conn()), r"^sleep 6161"))
        self.assertTrue(ok, "sleep 6161 started")
        task.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await task
        gone = await asyncio.to_thread(harness.wait_until, lambda: not live(dsec.Sandbox.connect(self.sb.id, **conn()), r"^sleep 6161"))
        self.assertTrue(gone, "the command died with the cancelled task")

    async def test_a_call_timeout_raises_timeout_error(self) -> None:
        with self.assertRaises(dsec.TimeoutError):
            await self.sb.commands.run("sleep 5", request_timeout=0.3)

    async def test_sessions_processes_and_files(self) -> None:
        async with await self.sb.sessions.create() as s:
            await s.run("cd /tmp; export V=7")
            self.assertEqual((await s.run('echo "$PWD $V"')).stdout, "/tmp 7\n")
        p = await self.sb.commands.start("cat", stdin=True)
        await p.write_stdin("in\n", eof=True)
        self.assertEqual((await p.wait(wait=10)).exit_code, 0)
        self.assertEqual((await p.output()).stdout, b"in\n")
        chunks = [ev.data async for ev in (await self.sb.commands.start("echo x; sleep 0.1; echo y")).follow(poll=0.1)]
        self.assertEqual(b"".join(chunks), b"x\ny\n")
        await self.sb.files.write("/w/f", b"\x00\xff")
        self.assertEqual(await self.sb.files.read("/w/f"), b"\x00\xff")
        self.assertEqual((await self.sb.files.stat("/w/f")).size, 2)
        self.assertEqual([e.name for e in (await self.sb.files.list("/w")).entries], ["f"])

    async def test_snapshot_fork_network_trajectory_and_pause(self) -> None:
        await self.sb.files.write("/work/s", "s\n")
        fork = await self.sb.fork(2)
        try:
            outs = await asyncio.gather(*(c.files.read_text("/work/s") for c in fork.sandboxes))
            self.assertEqual(outs, ["s\n", "s\n"])
        finally:
            await asyncio.gather(*(c.kill() for c in fork.sandboxes))
        self.assertEqual((await self.sb.set_network("none")).mode, "none")
        self.assertEqual([e.kind for e in (await self.sb.trajectory()).entries], ["files.write", "network.set"])
        self.assertEqual((await self.sb.pause()).status, "paused")
        with self.assertRaises(dsec.ConflictError):
            await self.sb.commands.run("true")
        self.assertEqual((await self.sb.resume()).status, "running")

    async def test_a_terminal(self) -> None:
        async with await self.sb.terminal(cmd=["/bin/sh", "-c", "echo hello-term; exit 3"]) as t:
            out = b"".join([c async for c in t])
            self.assertIn(b"hello-term", out)
            self.assertEqual(await t.wait(timeout=20), 3)

    async def test_closing_a_progress_iterator_early_cancels_the_batch(self) -> None:
        steps = dsec.AsyncSandbox.iter_create_many(3, concurrency=1, memory_mib=64, labels={"py-test": "async-early"}, **conn())
        async for step in steps:
            if step.sandbox is not None:
                break
        await steps.aclose()  # type: ignore[attr-defined]
        self.assertEqual((await dsec.AsyncSandbox.batch_info(step.batch_id, **conn())).state, "cancelled")
        gone = await asyncio.to_thread(harness.wait_until, lambda: dsec.Sandbox.list(labels={"py-test": "async-early"}, **conn()) == [])
        self.assertTrue(gone, "the cancelled batch's sandboxes were killed")

    async def test_create_many_and_the_context_manager(self) -> None:
        batch = await dsec.AsyncSandbox.create_many(3, concurrency=3, memory_mib=64, labels={"py-test": "async-many"}, **conn())
        self.assertEqual((len(batch.sandboxes), batch.failures), (3, []))
        steps = [s async for s in dsec.AsyncSandbox.iter_create_many(2, memory_mib=64, labels={"py-test": "async-many"}, **conn())]
        self.assertEqual((steps[0].event, steps[-1].event), ("accepted", "done"))
        batch.sandboxes += [s.sandbox for s in steps if s.sandbox is not None]
        self.assertEqual(len(batch.sandboxes), 5)
        for sb in batch.sandboxes:
            async with sb:
                self.assertEqual((await sb.commands.run("echo ok")).stdout, "ok\n")
        self.assertEqual(await dsec.AsyncSandbox.list(labels={"py-test": "async-many"}, **conn()), [])


if __name__ == "__main__":
    unittest.main()
