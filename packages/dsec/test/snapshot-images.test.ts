/** Snapshot image lifetimes, images through the SDK, and what gc says it kept. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Image, NotFoundError, Sandbox } from '@dsec/sdk';
import { integrationSkipReason, useServerAndSandbox, type TestServer } from './helpers/server.js';

describe('snapshot images and images in the SDK', { skip: integrationSkipReason(), timeout: 240_000 }, () => {
  let server: TestServer;
  useServerAndSandbox({}, (s) => {
    server = s;
  });

  const gone = async (imageId: string): Promise<boolean> => {
    try {
      await Image.get(imageId, server.conn);
      return false;
    } catch (err) {
      if (err instanceof NotFoundError && err.code === 'IMAGE_NOT_FOUND') return true;
      throw err;
    }
  };
  const changed = async (): Promise<Sandbox> => {
    const sb = await Sandbox.create(server.conn);
    await sb.files.write('/tmp/state', sb.id);
    return sb;
  };

  test('an unnamed snapshot is deleted with its sandbox, and says so', async () => {
    const sb = await changed();
    const snap = await sb.snapshot();
    assert.equal(snap.kept, false);
    assert.equal(snap.image.id, snap.imageId);
    assert.equal((await snap.image.refresh()).snapshotOf, sb.id);
    assert.ok((await Image.list(server.conn)).some((i) => i.id === snap.imageId && i.info?.snapshotOf === sb.id));
    await sb.kill();
    assert.ok(await gone(snap.imageId), 'the unnamed snapshot outlived its sandbox');
  });

  test('a named or kept snapshot outlives its sandbox', async () => {
    const sb = await changed();
    const named = await sb.snapshot({ name: 'kept-by-name' });
    await sb.files.write('/tmp/more', 'x');
    const kept = await sb.snapshot({ keep: true });
    assert.deepEqual([named.kept, kept.kept], [true, true]);
    assert.equal((await kept.image.refresh()).snapshotOf, undefined);
    await sb.kill();
    assert.deepEqual((await Image.get('kept-by-name', server.conn)).info?.names, ['kept-by-name:latest']);
    assert.equal((await Image.get(kept.imageId, server.conn)).id, kept.imageId);
    await Image.delete('kept-by-name', server.conn);
    await kept.image.delete();
    assert.ok(await gone(kept.imageId));
  });

  test("a fork's snapshot lives while any fork or the parent does, then goes", async () => {
    const parent = await changed();
    const { sandboxes, result } = await parent.fork(2);
    assert.equal(sandboxes.length, 2);
    const imageId = result.snapshot.imageId;
    await parent.kill();
    assert.equal(await gone(imageId), false, 'deleted while forks run from it');
    await sandboxes[0]!.kill();
    assert.equal(await gone(imageId), false);
    await sandboxes[1]!.kill();
    assert.ok(await gone(imageId), 'the fork snapshot outlived every sandbox that used it');
  });

  test('a restore keeps the snapshot alive after its own sandbox is killed', async () => {
    const sb = await changed();
    const snap = await sb.snapshot();
    const restored = await Sandbox.create({ ...server.conn, image: snap.imageId });
    await sb.kill();
    assert.equal(await restored.files.readText('/tmp/state'), sb.id);
    assert.equal(await gone(snap.imageId), false);
    await restored.kill();
    assert.ok(await gone(snap.imageId));
  });

  test('Image.build, get and delete through the SDK; gc says why it kept what it kept', async () => {
    const img = await Image.build({ ...server.conn, builder: 'busybox', name: 'sdk-busybox' });
    assert.ok(img.info?.names.includes('sdk-busybox:latest'));
    assert.equal((await Image.get('sdk-busybox', server.conn)).id, img.id);
    await Image.delete('sdk-busybox', server.conn);
    await assert.rejects(Image.get('sdk-busybox', server.conn), NotFoundError);
    const gc = await Image.gc(server.conn);
    assert.equal(gc.keptLayers, gc.keptInUse + gc.keptYoung);
    assert.equal(gc.graceSeconds, 600);
    assert.ok(gc.keptInUse >= 1, 'busybox is in use by an image');
    // The unnamed snapshots deleted above left layers no image uses, younger than the grace period.
    assert.ok(gc.keptYoung >= 1 && gc.keptYoungBytes > 0, JSON.stringify(gc));
  });
});
