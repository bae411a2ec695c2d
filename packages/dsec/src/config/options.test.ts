import assert from 'node:assert/strict';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { DEFAULT_DATA_DIR } from '@dsec/sdk';
import { OptionsError, compileOptions, parseListen, parseRegistryAllow } from './options.js';

describe('compileOptions', () => {
  test('with no flags and no env every option has its default', () => {
    assert.deepEqual(compileOptions({}, {}), {
      dataDir: DEFAULT_DATA_DIR,
      listen: '127.0.0.1:7070',
      edgeId: 'local',
      maxSandboxes: 4000,
      layerCacheMiB: 20480,
      layerFetch: 'eager',
      userns: true,
      usernsPool: 2,
      layerChunkKiB: 256,
      minFreeDiskMiB: 256,
      minAvailableMemoryMiB: 256,
      maxMemoryPressure: 40,
      outputBudgetMiB: 1024,
      trajectoryRetentionHours: 24,
      logLevel: 'info',
      store: '',
      layerDir: '',
      registry: '',
      registryAllow: '',
      portsListen: '',
      portsUrl: '',
    });
  });

  test('environment variables set options, strings converted to their types', () => {
    const opts = compileOptions(
      {},
      {
        DSEC_DATA_DIR: '/srv/dsec',
        DSEC_LISTEN: '0.0.0.0:8080',
        DSEC_EDGE_ID: 'node7',
        DSEC_MAX_SANDBOXES: '12',
        DSEC_LAYER_CACHE_MIB: '512',
        DSEC_TRAJECTORY_RETENTION_HOURS: '2',
        DSEC_LOG_LEVEL: 'warn',
        DSEC_MIN_FREE_DISK_MIB: '0',
        DSEC_MIN_AVAILABLE_MEMORY_MIB: '1024',
        DSEC_MAX_MEMORY_PRESSURE: '0',
        DSEC_USERNS_POOL: '0',
      },
    );
    assert.deepEqual(opts, {
      dataDir: '/srv/dsec',
      listen: '0.0.0.0:8080',
      edgeId: 'node7',
      maxSandboxes: 12,
      layerCacheMiB: 512,
      layerFetch: 'eager',
      layerChunkKiB: 256,
      userns: true,
      usernsPool: 0,
      minFreeDiskMiB: 0,
      minAvailableMemoryMiB: 1024,
      maxMemoryPressure: 0,
      outputBudgetMiB: 1024,
      trajectoryRetentionHours: 2,
      logLevel: 'warn',
      store: '',
      layerDir: '',
      registry: '',
      registryAllow: '',
      portsListen: '',
      portsUrl: '',
    });
  });

  test('DSEC_REGISTRY_ALLOW lists the registries project keys may name; a value with other characters is refused', () => {
    const opts = compileOptions({}, { DSEC_REGISTRY_ALLOW: 'Registry.Example.com, 10.0.0.5:5000,' });
    assert.deepEqual(parseRegistryAllow(opts.registryAllow), ['registry.example.com', '10.0.0.5:5000']);
    assert.equal(compileOptions({ registryAllow: 'a.example' }, { DSEC_REGISTRY_ALLOW: 'b.example' }).registryAllow, 'a.example');
    assert.throws(() => compileOptions({}, { DSEC_REGISTRY_ALLOW: 'http://x/y' }), OptionsError);
  });

  test('DSEC_USERNS=false opts out of user namespaces (on by default); a value that is not a boolean is refused', () => {
    assert.equal(compileOptions({}, { DSEC_USERNS: 'true' }).userns, true);
    assert.equal(compileOptions({}, { DSEC_USERNS: 'false' }).userns, false);
    assert.throws(() => compileOptions({}, { DSEC_USERNS: 'maybe' }), OptionsError);
  });

  test('DSEC_USERNS_POOL sizes the pool of user namespaces made ahead (default 2); a negative size is refused', () => {
    assert.equal(compileOptions({}, { DSEC_USERNS_POOL: '5' }).usernsPool, 5);
    assert.throws(() => compileOptions({}, { DSEC_USERNS_POOL: '-1' }), OptionsError);
  });

  test('a relative data dir is made absolute (crun is started from a mount namespace where the cwd is /)', () => {
    assert.equal(compileOptions({ dataDir: 'rel/dsec' }, {}).dataDir, join(process.cwd(), 'rel/dsec'));
    assert.equal(compileOptions({}, { DSEC_DATA_DIR: './d' }).dataDir, join(process.cwd(), 'd'));
  });

  test('flags win over environment variables', () => {
    const opts = compileOptions({ dataDir: '/from/flag', maxSandboxes: '3' }, { DSEC_DATA_DIR: '/from/env', DSEC_MAX_SANDBOXES: '9' });
    assert.equal(opts.dataDir, '/from/flag');
    assert.equal(opts.maxSandboxes, 3);
  });

  test('undefined flags and empty env values fall through to the next source', () => {
    const opts = compileOptions({ dataDir: undefined }, { DSEC_DATA_DIR: '', DSEC_LISTEN: '127.0.0.1:9' });
    assert.equal(opts.dataDir, DEFAULT_DATA_DIR);
    assert.equal(opts.listen, '127.0.0.1:9');
  });

  test('environment variables that are not dsec options are ignored', () => {
    const opts = compileOptions({}, { HOME: '/root', DSEC_UNKNOWN: 'x' });
    assert.equal(opts.edgeId, 'local');
  });

  test('an unknown flag is rejected with OptionsError', () => {
    assert.throws(() => compileOptions({ bogus: 1 } as never, {}), OptionsError);
  });

  test('a listen address without a port is rejected, naming the field', () => {
    assert.throws(
      () => compileOptions({ listen: 'localhost' }, {}),
      (err: unknown) => {
        assert.ok(err instanceof OptionsError);
        assert.match(err.message, /listen/);
        return true;
      },
    );
  });

  test('an edge id with upper case or dashes is rejected (it is part of every sandbox id)', () => {
    assert.throws(() => compileOptions({ edgeId: 'Edge-1' }, {}), OptionsError);
    assert.throws(() => compileOptions({}, { DSEC_EDGE_ID: 'a'.repeat(33) }), OptionsError);
  });

  test('maxSandboxes below 1 or not a number is rejected', () => {
    assert.throws(() => compileOptions({ maxSandboxes: '0' }, {}), OptionsError);
    assert.throws(() => compileOptions({}, { DSEC_MAX_SANDBOXES: 'many' }), OptionsError);
  });

  test('layerFetch is eager or lazy (DSEC_LAYER_FETCH)', () => {
    assert.equal(compileOptions({}, { DSEC_LAYER_FETCH: 'lazy' }).layerFetch, 'lazy');
    assert.throws(() => compileOptions({ layerFetch: 'sometimes' }, {}), /layerFetch/);
  });

  test('layerCacheMiB may be 0 (cache only what is mounted) but not negative or fractional', () => {
    assert.equal(compileOptions({ layerCacheMiB: '0' }, {}).layerCacheMiB, 0);
    assert.throws(() => compileOptions({ layerCacheMiB: '-1' }, {}), /layerCacheMiB/);
    assert.throws(() => compileOptions({}, { DSEC_LAYER_CACHE_MIB: '1.5' }), /layerCacheMiB/);
  });

  test('a fractional maxSandboxes is rejected, not silently truncated', () => {
    assert.throws(() => compileOptions({ maxSandboxes: '2.5' }, {}), OptionsError, 'maxSandboxes 2.5 was accepted');
  });

  test('a listen port above 65535 is rejected with OptionsError', () => {
    assert.throws(() => compileOptions({ listen: '127.0.0.1:99999' }, {}), OptionsError, 'listen 127.0.0.1:99999 was accepted');
  });

  test('an unknown log level is rejected', () => {
    assert.throws(() => compileOptions({ logLevel: 'verbose' }, {}), OptionsError);
  });

  test('an empty data dir flag is rejected', () => {
    assert.throws(() => compileOptions({ dataDir: '' }, {}), OptionsError);
  });

  test('the OptionsError message says which option is invalid', () => {
    assert.throws(() => compileOptions({ maxSandboxes: '0' }, {}), /maxSandboxes/);
  });
});

describe('parseListen', () => {
  test('splits host and port', () => {
    assert.deepEqual(parseListen('127.0.0.1:7070'), { host: '127.0.0.1', port: 7070 });
  });

  test('splits at the last colon, so an IPv6 host keeps its colons', () => {
    assert.deepEqual(parseListen('::1:8080'), { host: '::1', port: 8080 });
  });
});
