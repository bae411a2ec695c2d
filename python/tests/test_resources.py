"""Volumes, ports, images, pools and bulk calls from Python, against a real dsec: the parts of the
TypeScript SDK's surface the Python SDK gained last (issue 30), each for real."""

from __future__ import annotations

import asyncio
import secrets
import time
import unittest

import dsec
from support import SKIP, conn

CGI_BAD_GATEWAY = '#!/bin/sh\nprintf "Status: 502 Bad Gateway\\r\\nContent-Type: text/plain\\r\\n\\r\\nupstream down\\n"\n'


@unittest.skipIf(SKIP, SKIP or "")
class PortsTest(unittest.TestCase):
    sb: dsec.Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = dsec.Sandbox.create("busybox", memory_mib=64, **conn())
        cls.sb.files.write("/www/index.html", "<h1>hi from python</h1>\n")
        cls.sb.files.write("/www/cgi-bin/bad", CGI_BAD_GATEWAY, mode=0o755)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.sb.kill()

    def test_fetch_before_the_server_listens_raises_then_wait_then_fetch(self) -> None:
        with self.assertRaises(dsec.ServerError) as e:
            self.sb.ports.fetch(8080, "/index.html")
        self.assertEqual(e.exception.code, "PORT_NOT_LISTENING")
        self.sb.commands.start(["httpd", "-f", "-p", "8080", "-h", "/www"], stdin=False)
        waited = self.sb.ports.wait(8080, wait=20)
        self.assertIsInstance(waited, dsec.PortWait)
        self.assertEqual(waited.port, 8080)
        self.assertGreaterEqual(waited.waited_ms, 0)
        r = self.sb.ports.fetch(8080, "/index.html")
        self.assertEqual((r.status, r.text()), (200, "<h1>hi from python</h1>\n"))
        self.assertEqual(self.sb.ports.fetch(8080, "/nope").status, 404, "the server's 404 is its answer")
        bad = self.sb.ports.fetch(8080, "/cgi-bin/bad")
        self.assertEqual((bad.status, bad.text()), (502, "upstream down\n"), "the server's own 502 is returned, not raised")
        self.assertNotIn("x-dsec-error", bad.headers)
        posted = self.sb.ports.fetch(8080, "/index.html", method="POST", body=b"x", headers={"content-type": "text/plain"})
        self.assertEqual(posted.status, 501, "httpd's own 501 for a POST to a file is returned, not raised")

    def test_wait_times_out_with_a_timeout_error_and_url_and_link_name_the_port(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(dsec.TimeoutError) as e:
            self.sb.ports.wait(8099, wait=0.3)
        self.assertEqual(e.exception.code, "PORT_WAIT_TIMEOUT")
        self.assertLess(time.monotonic() - t0, 60)
        self.assertTrue(self.sb.ports.url(8080, "/x").endswith(f"/v1/sandboxes/{self.sb.id}/ports/8080/x"))
        link = self.sb.ports.link(8080, ttl_seconds=60)
        self.assertIn("/v1/port-links/", link.url)
        self.assertEqual(link.port, 8080)
        with self.assertRaises(dsec.InvalidRequestError):
            self.sb.ports.wait(0)


@unittest.skipIf(SKIP, SKIP or "")
class VolumesTest(unittest.TestCase):
    def test_a_volume_outlives_its_sandboxes_mounts_read_only_and_is_deleted_when_unused(self) -> None:
        name = f"pyvol-{secrets.token_hex(3)}"
        v = dsec.Volume.create(name, labels={"by": "python"}, **conn())
        try:
            self.assertIn(name, [x.name for x in dsec.Volume.list(**conn())])
            with dsec.Sandbox.create("busybox", memory_mib=64, volumes=[{"name": name, "path": "/data"}], **conn()) as sb:
                sb.commands.run("echo kept > /data/f", check=True)
                self.assertEqual(v.refresh().mounted_by, [sb.id])
                with self.assertRaises(dsec.ConflictError) as e:
                    v.delete()
                self.assertEqual(e.exception.code, "VOLUME_IN_USE")
            with dsec.Sandbox.create("busybox", memory_mib=64, volumes=[{"name": name, "path": "/ro", "read_only": True}], **conn()) as sb:
                self.assertEqual(sb.commands.run("cat /ro/f").stdout, "kept\n")
                self.assertNotEqual(sb.commands.run("echo x > /ro/g").exit_code, 0, "read_only is read-only")
            got = dsec.Volume.get(name, **conn())
            self.assertEqual(got.info.labels, {"by": "python"})
            self.assertGreaterEqual(got.info.bytes or 0, 5)
        finally:
            v.delete()
        with self.assertRaises(dsec.NotFoundError):
            dsec.Volume.get(name, **conn())


@unittest.skipIf(SKIP, SKIP or "")
class ImagesTest(unittest.TestCase):
    def test_list_get_snapshot_delete_and_gc(self) -> None:
        self.assertIn("busybox:latest", [n for i in dsec.Image.list(**conn()) for n in i.info.names])
        bb = dsec.Image.get("busybox", **conn())
        self.assertTrue(bb.id.startswith("sha256:"))
        with dsec.Sandbox.create("busybox", memory_mib=64, **conn()) as sb:
            sb.files.write("/snap.txt", "in the snapshot\n")
            named = f"pysnap-{secrets.token_hex(3)}"
            snap = sb.snapshot(name=named)
        img = dsec.Image.get(named, **conn())
        self.assertEqual(img.id, snap.image_id)
        self.assertEqual(img.refresh().layers, snap.layers)
        img.delete()  # a snapshot deleted from Python
        with self.assertRaises(dsec.NotFoundError):
            dsec.Image.get(snap.image_id, **conn())
        with self.assertRaises(dsec.NotFoundError):
            dsec.Image.delete_by_ref(named, **conn())
        gc = dsec.Image.gc(**conn())
        self.assertIsInstance(gc.kept_in_use, int)
        self.assertGreaterEqual(gc.kept_in_use, len(bb.info.layers))


@unittest.skipIf(SKIP, SKIP or "")
class PoolsAndBulkTest(unittest.TestCase):
    def test_a_create_naming_a_pool_claims_its_ready_sandbox_and_the_handle_deletes_it(self) -> None:
        name = f"pypool-{secrets.token_hex(3)}"
        pool = dsec.Pool.create(name, 1, "busybox", memory_mib=72, **conn())
        try:
            self.assertEqual((pool.name, pool.info.size), (name, 1))
            deadline = time.monotonic() + 60
            while pool.refresh().ready < 1:
                self.assertLess(time.monotonic(), deadline, f"pool never filled: {pool.info}")
                time.sleep(0.1)
            with dsec.Sandbox.create("busybox", memory_mib=72, pool=name, labels={"t": name}, **conn()) as sb:
                self.assertEqual(sb.info.labels.get("t"), name)
                self.assertEqual(pool.refresh().claims, 1)
                self.assertEqual(sb.commands.run("echo claimed").stdout, "claimed\n")
            self.assertIn(name, [p.name for p in dsec.Pool.list(**conn())])
        finally:
            pool.delete()
        with self.assertRaises(dsec.NotFoundError):
            dsec.Pool.get(name, **conn())

    def test_pause_resume_and_kill_all_by_label_and_trajectory_by_id(self) -> None:
        tag = secrets.token_hex(4)
        sbs = [dsec.Sandbox.create("busybox", memory_mib=64, labels={"bulk": tag}, **conn()) for _ in range(2)]
        sbs[0].commands.run("echo step")
        ids = sorted(s.id for s in sbs)
        self.assertEqual(sorted(dsec.Sandbox.pause_all(labels={"bulk": tag}, **conn()).ids), ids)
        self.assertEqual({s.refresh().status for s in sbs}, {"paused"})
        self.assertEqual(sorted(dsec.Sandbox.resume_all(labels={"bulk": tag}, **conn()).ids), ids)
        killed = dsec.Sandbox.kill_all(labels={"bulk": tag}, **conn())
        self.assertEqual((sorted(killed.ids), killed.failures), (ids, []))
        self.assertEqual(dsec.Sandbox.list(labels={"bulk": tag}, **conn()), [])
        kept = dsec.Sandbox.trajectory_by_id(sbs[0].id, **conn())
        self.assertIn("exec", [e.kind for e in kept.entries])
        with self.assertRaises(dsec.InvalidRequestError):
            dsec.Sandbox.kill_all(labels={}, **conn())

    def test_trajectories_by_label_and_batch_include_killed_sandboxes_and_a_fork_reads_its_lineage(self) -> None:
        tag = secrets.token_hex(4)
        a, b = (dsec.Sandbox.create("busybox", memory_mib=64, labels={"traj": tag}, **conn()) for _ in range(2))
        try:
            a.commands.run("echo a1")
            a.files.write("/tmp/a", "a\n")
            b.commands.run("echo b1")
            b.kill()  # killed: its log is kept, and still streams
            steps = list(dsec.Sandbox.trajectories(labels={"traj": tag}, **conn()))
            self.assertEqual([(e.sandbox_id, e.seq) for e in steps], sorted([(a.id, 1), (a.id, 2), (b.id, 1)]))
            self.assertEqual([e.kind for e in steps if e.sandbox_id == a.id], ["exec", "files.write"])
            self.assertEqual(list(dsec.Sandbox.trajectories(labels={"traj": tag, "other": "x"}, **conn())), [])

            fork = a.fork(1)
            child = fork.sandboxes[0]
            try:
                self.assertEqual((child.info.labels["dsec.fork-of"], child.info.labels["dsec.fork-at-seq"]), (a.id, "2"))
                a.commands.run("echo a-after-the-fork")  # the parent's, not the child's past
                child.commands.run("echo c1")
                t = child.trajectory(lineage=True)
                self.assertEqual([(e.sandbox_id, e.seq) for e in t.entries], [(a.id, 1), (a.id, 2), (child.id, 1)])
                self.assertEqual(t.lineage_missing, [])
                self.assertEqual([(e.sandbox_id, e.seq) for e in child.trajectory().entries], [(None, 1)])
                by_id = dsec.Sandbox.trajectory_by_id(child.id, lineage=True, **conn())
                self.assertEqual(len(by_id.entries), 3)
            finally:
                child.kill()
        finally:
            a.kill()
        batch = dsec.Sandbox.create_many(2, image="busybox", memory_mib=64, labels={"traj-batch": tag}, **conn())
        try:
            for sb in batch.sandboxes:
                sb.commands.run("true")
            got = {e.sandbox_id for e in dsec.Sandbox.trajectories(batch=batch.batch_id, **conn())}
            self.assertEqual(got, {sb.id for sb in batch.sandboxes})
        finally:
            for sb in batch.sandboxes:
                sb.kill()
        with self.assertRaises(dsec.InvalidRequestError):
            list(dsec.Sandbox.trajectories(**conn()))
        with self.assertRaises(dsec.NotFoundError):
            list(dsec.Sandbox.trajectories(batch="batch-nosuch0", **conn()))


@unittest.skipIf(SKIP, SKIP or "")
class AsyncResourcesTest(unittest.IsolatedAsyncioTestCase):
    async def test_the_asyncio_face_waits_for_a_port_and_lists_images_pools_and_volumes(self) -> None:
        async with await dsec.AsyncSandbox.create("busybox", memory_mib=64, **conn()) as sb:
            await sb.files.write("/www/index.html", "async\n")
            await sb.commands.start(["httpd", "-f", "-p", "8080", "-h", "/www"], stdin=False)
            self.assertEqual((await sb.ports.wait(8080, wait=20)).port, 8080)
            r = await sb.ports.fetch(8080, "/index.html")
            self.assertEqual((r.status, r.body), (200, b"async\n"))
        images, pools, volumes = await asyncio.gather(dsec.AsyncImage.list(**conn()), dsec.AsyncPool.list(**conn()), dsec.AsyncVolume.list(**conn()))
        self.assertTrue(any("busybox:latest" in i.info.names for i in images), [i.info.names for i in images])
        self.assertIsInstance(pools, list)
        self.assertIsInstance(volumes, list)

    async def test_the_asyncio_face_streams_trajectories_by_label(self) -> None:
        tag = secrets.token_hex(4)
        async with await dsec.AsyncSandbox.create("busybox", memory_mib=64, labels={"atraj": tag}, **conn()) as sb:
            await sb.commands.run("echo one")
            steps = [e async for e in dsec.AsyncSandbox.trajectories(labels={"atraj": tag}, **conn())]
            self.assertEqual([(e.sandbox_id, e.seq, e.kind) for e in steps], [(sb.id, 1, "exec")])
            t = await sb.trajectory(lineage=True)
            self.assertEqual(([(e.sandbox_id, e.seq) for e in t.entries], t.lineage_missing), ([(sb.id, 1)], []))


if __name__ == "__main__":
    unittest.main()
