import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CorruptManifestError, ImageStore, defaultImageConfig, isImageName, normalizeName } from './image-store.js';
import { LayerStore, isLayerDigest, sha256File } from './layer-store.js';

describe('image names', () => {
  test('valid names: lower case, digits, . _ -, optional :tag', () => {
    for (const n of ['busybox', 'debian:py', 'my-image_1.2', 'a:b.c-d']) assert.ok(isImageName(n), n);
  });

  test('invalid names: upper case, slashes, empty parts, leading punctuation', () => {
    for (const n of ['', 'Busybox', 'a/b', '../x', ':tag', 'name:', '-x', 'a:b:c', `${'a'.repeat(64)}`]) assert.ok(!isImageName(n), n);
  });

  test('a name without a tag means :latest', () => {
    assert.equal(normalizeName('busybox'), 'busybox:latest');
    assert.equal(normalizeName('debian:py'), 'debian:py');
  });

  test('isLayerDigest accepts sha256:<64 hex> only', () => {
    assert.ok(isLayerDigest(`sha256:${'a'.repeat(64)}`));
    assert.ok(!isLayerDigest(`sha256:${'A'.repeat(64)}`));
    assert.ok(!isLayerDigest('sha256:abc'));
  });
});

describe('LayerStore and ImageStore', () => {
  let root: string;
  let layers: LayerStore;
  let images: ImageStore;

  const blob = async (content: string) => {
    const file = layers.tempPath();
    writeFileSync(file, content);
    return layers.add(file);
  };

  before(() => {
    root = mkdtempSync(join(tmpdir(), 'dsec-unit-images-'));
    layers = new LayerStore(root);
    images = new ImageStore(root, layers);
  });
  after(() => {
    rmSync(root, { recursive: true, force: true });
  });

  test('a layer is stored under the sha256 of its bytes', async () => {
    const digest = await blob('layer one');
    assert.equal(digest, `sha256:${createHash('sha256').update('layer one').digest('hex')}`);
    assert.ok(layers.has(digest));
    assert.equal(layers.size(digest), 'layer one'.length);
    assert.equal(await sha256File(layers.path(digest)), digest);
  });

  test('adding the same bytes twice keeps one blob and removes the temp file', async () => {
    const a = await blob('same');
    const tmp = layers.tempPath();
    writeFileSync(tmp, 'same');
    const b = await layers.add(tmp);
    assert.equal(a, b);
    assert.equal(existsSync(tmp), false);
    assert.equal(layers.list().filter((d) => d === a).length, 1);
  });

  test('put refuses a manifest whose layer is not in the store', () => {
    assert.throws(() => images.put({ layers: [`sha256:${'f'.repeat(64)}`], config: defaultImageConfig() }), /not in the store/);
  });

  test('put is idempotent: same manifest, same id, one file', async () => {
    const layer = await blob('idempotent');
    const a = images.put({ layers: [layer], config: defaultImageConfig() });
    const b = images.put({ layers: [layer], config: defaultImageConfig() });
    assert.equal(a, b);
    assert.match(a, /^sha256:[0-9a-f]{64}$/);
    assert.equal(readdirSync(images.dir).filter((f) => f === `${a.slice(7)}.json`).length, 1);
  });

  test('a different config gives a different id', async () => {
    const layer = await blob('config-differs');
    const a = images.put({ layers: [layer], config: defaultImageConfig() });
    const b = images.put({ layers: [layer], config: defaultImageConfig({ cwd: '/work' }) });
    assert.notEqual(a, b);
  });

  test('resolve finds an image by name, by name:latest and by id', async () => {
    const layer = await blob('resolve');
    const id = images.put({ layers: [layer], config: defaultImageConfig() });
    images.tag('resolve-me', id);
    assert.equal(images.resolve('resolve-me'), id);
    assert.equal(images.resolve('resolve-me:latest'), id);
    assert.equal(images.resolve(id), id);
  });

  test('resolve of an unknown name, unknown id or invalid reference is undefined', () => {
    assert.equal(images.resolve('nope'), undefined);
    assert.equal(images.resolve(`sha256:${'0'.repeat(64)}`), undefined);
    assert.equal(images.resolve('../../etc/passwd'), undefined);
  });

  test('tag refuses an invalid name', async () => {
    const layer = await blob('bad-tag');
    const id = images.put({ layers: [layer], config: defaultImageConfig() });
    assert.throws(() => images.tag('Bad/Name', id), /invalid image name/);
  });

  test('info lists names, layers, config and size', async () => {
    const layer = await blob('info-layer');
    const id = images.put({ layers: [layer], config: defaultImageConfig({ cwd: '/srv' }) });
    images.tag('info-image:v1', id);
    const info = images.info(id)!;
    assert.deepEqual(info.names, ['info-image:v1']);
    assert.deepEqual(info.layers, [layer]);
    assert.equal(info.config.cwd, '/srv');
    assert.equal(info.sizeBytes, 'info-layer'.length);
  });

  test('retagging a name points it at the new image', async () => {
    const a = images.put({ layers: [await blob('retag-a')], config: defaultImageConfig() });
    const b = images.put({ layers: [await blob('retag-b')], config: defaultImageConfig() });
    images.tag('retag', a);
    images.tag('retag', b);
    assert.equal(images.resolve('retag'), b);
  });

  test('untag removes the name, not the image', async () => {
    const id = images.put({ layers: [await blob('untag')], config: defaultImageConfig() });
    images.tag('untag-me', id);
    images.untag('untag-me');
    assert.equal(images.resolve('untag-me'), undefined);
    assert.equal(images.resolve(id), id);
  });
});

describe('ImageStore: what it read lately', () => {
  test("its own changes show at once; another process's within a second; each get() is a manifest of its own", async () => {
    const root = mkdtempSync(join(tmpdir(), 'dsec-unit-recent-'));
    try {
      const layers = new LayerStore(root);
      const images = new ImageStore(root, layers);
      const other = new ImageStore(root, layers); // another process on the same files
      const layer = async (content: string) => {
        const file = layers.tempPath();
        writeFileSync(file, content);
        return layers.add(file);
      };
      const a = images.put({ layers: [await layer('recent-a')], config: defaultImageConfig() });
      const b = images.put({ layers: [await layer('recent-b')], config: defaultImageConfig() });
      images.tag('recent', a);
      assert.equal(images.resolve('recent'), a);
      images.tag('recent', b);
      assert.equal(images.resolve('recent'), b, 'its own retag: at once');
      other.tag('recent', a);
      await new Promise((r) => setTimeout(r, 1100));
      assert.equal(images.resolve('recent'), a, "another's retag: within a second");
      const m1 = images.get(a)!;
      m1.layers.push('sha256:changed');
      assert.equal(images.get(a)!.layers.length, 1, "one caller's change is not the next caller's manifest");
      other.remove(a);
      await new Promise((r) => setTimeout(r, 1100));
      assert.equal(images.get(a), undefined, "another's remove: within a second");
      assert.equal(images.resolve(a), undefined);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe('ImageStore: a corrupt manifest', () => {
  test('is an error naming the file, not an absent image', () => {
    const root = mkdtempSync(join(tmpdir(), 'dsec-unit-manifest-'));
    try {
      const images = new ImageStore(root, new LayerStore(root));
      const id = `sha256:${'c'.repeat(64)}` as const;
      assert.equal(images.get(id), undefined, 'absent: undefined');
      const file = join(images.dir, `${'c'.repeat(64)}.json`);
      writeFileSync(file, '{"layers": [tru');
      assert.throws(
        () => images.get(id),
        (err: unknown) => err instanceof CorruptManifestError && err.message.includes(file),
      );
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
