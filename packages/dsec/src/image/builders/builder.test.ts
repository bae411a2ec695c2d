import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { which } from '../../host/doctor.js';
import { ImageStore, defaultImageConfig } from '../image-store.js';
import { LayerStore } from '../layer-store.js';
import { BuildInputError, CACHE_KEY_LABEL, buildSingleLayerImage } from './builder.js';

const KEY = 'a'.repeat(64);

describe('buildSingleLayerImage cache', { skip: which('mkfs.erofs') ? undefined : 'needs mkfs.erofs on PATH' }, () => {
  let root: string;
  let images: ImageStore;
  let fills = 0;

  const build = (name: string) =>
    buildSingleLayerImage({
      store: images,
      name,
      cacheKey: KEY,
      progress: () => {},
      config: defaultImageConfig(),
      fill: async (dir) => {
        fills++;
        mkdirSync(join(dir, 'etc'), { recursive: true });
        writeFileSync(join(dir, 'etc/motd'), 'built\n');
      },
    });

  before(() => {
    root = mkdtempSync(join(tmpdir(), 'dsec-unit-builder-'));
    images = new ImageStore(root, new LayerStore(root));
  });
  after(() => rmSync(root, { recursive: true, force: true }));

  test('the same inputs under the same name are reused', async () => {
    const first = await build('bbx');
    assert.equal(first.cached, false);
    const again = await build('bbx');
    assert.equal(again.cached, true);
    assert.equal(again.id, first.id);
    assert.equal(fills, 1);
  });

  test('a name re-pointed at another image carrying the cache-key label is rebuilt, not trusted', async () => {
    const built = images.resolve('bbx')!;
    const m = images.get(built)!;
    assert.equal(m.config.labels[CACHE_KEY_LABEL], KEY);
    // What a snapshot tagged with the builder's name used to be: the base layers plus a delta, same config.
    const file = images.layers.tempPath();
    writeFileSync(file, 'a tampered delta');
    const delta = await images.layers.add(file);
    const impostor = images.put({ layers: [...m.layers, delta], config: m.config });
    images.tag('bbx', impostor);
    const r = await build('bbx');
    assert.equal(r.cached, false, 'the build trusted a name something else re-pointed');
    const now = images.resolve('bbx')!;
    assert.notEqual(now, impostor);
    assert.equal(now, r.id);
    assert.equal(images.get(now)!.layers.length, 1, 'the name points at a fresh single-layer build');
    assert.equal((await build('bbx')).cached, true, 'the fresh build is the cache again');
  });

  test('an invalid name fails before any work, with a BuildInputError', async () => {
    const before = fills;
    await assert.rejects(
      build('BadName'),
      (err: unknown) => err instanceof BuildInputError && /invalid image name "BadName"/.test(err.message),
    );
    assert.equal(fills, before, 'the builder ran before checking the name');
  });
});
