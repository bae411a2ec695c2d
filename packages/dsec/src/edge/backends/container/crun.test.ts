import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { readCrunLog } from './crun.js';

describe('readCrunLog', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-crun-'));
  });
  after(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  test('turns JSON log lines into their messages', () => {
    const file = join(dir, 'json.log');
    writeFileSync(file, '{"msg":"first problem","level":"error"}\n{"msg":"second","level":"error"}\n');
    assert.equal(readCrunLog(file), 'first problem\nsecond');
  });

  test('keeps lines that are not JSON as they are', () => {
    const file = join(dir, 'mixed.log');
    writeFileSync(file, 'plain text\n{"msg":"json"}\n{"level":"error"}\n');
    assert.equal(readCrunLog(file), 'plain text\njson\n{"level":"error"}');
  });

  test('a missing log says so', () => {
    assert.equal(readCrunLog(join(dir, 'missing.log')), '(crun left no log)');
  });
});
