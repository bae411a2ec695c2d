/**
 * A test process killed before its ClusterHarness closed leaves the harness's network namespaces
 * and bridge on the host (with the bridge's 169.254.X.0/24 taken); the next harness removes
 * those whose owner process is gone, and never a live owner's.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { ownerTag, PID_SPACE } from '../../src/host/process-owner.js';
import { integrationSkipReason } from '../helpers/server.js';
import { HARNESS_OWNERS, sweepAbandonedHarnesses } from './support/cluster-harness.js';

const ip = (...args: string[]): void => void execFileSync('ip', args, { stdio: 'pipe' });

test("a harness left by a killed process is swept, a live one's is kept", { skip: integrationSkipReason() }, () => {
  mkdirSync(HARNESS_OWNERS, { recursive: true });
  // This process's pid with another start time: the owner that wrote it is gone.
  const owners = { f0f0f1: `${PID_SPACE}/${process.pid}.1`, f0f0f2: ownerTag() };
  try {
    for (const [tag, owner] of Object.entries(owners)) {
      ip('netns', 'add', `dsec-${tag}-e0`);
      ip('link', 'add', `dsbr${tag}`, 'type', 'bridge');
      writeFileSync(join(HARNESS_OWNERS, tag), owner);
    }
    assert.ok(sweepAbandonedHarnesses().includes('f0f0f1'));
    assert.ok(
      !existsSync('/run/netns/dsec-f0f0f1-e0') && !existsSync('/sys/class/net/dsbrf0f0f1'),
      "the dead owner's namespace and bridge are gone",
    );
    assert.ok(!existsSync(join(HARNESS_OWNERS, 'f0f0f1')));
    assert.ok(existsSync('/run/netns/dsec-f0f0f2-e0') && existsSync('/sys/class/net/dsbrf0f0f2'), "a live owner's are kept");
  } finally {
    for (const tag of Object.keys(owners)) {
      spawnSync('ip', ['netns', 'delete', `dsec-${tag}-e0`], { stdio: 'ignore' }); // gone already where swept
      spawnSync('ip', ['link', 'delete', `dsbr${tag}`], { stdio: 'ignore' });
      rmSync(join(HARNESS_OWNERS, tag), { force: true });
    }
  }
});
