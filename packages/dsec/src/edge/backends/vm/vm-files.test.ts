import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApiError } from '../../../api-error.js';
import { VmFiles } from './vm-files.js';

/** The guest agent does file calls as the guest's root only: a user or metadata is refused before the VM is asked. */
describe('VmFiles refuses what its agent does not do', () => {
  const files = new VmFiles({
    running: () => {
      throw new Error('the VM must not be reached');
    },
    find: () => undefined,
  });
  const alice = { uid: 1000, gid: 1000, groups: [] };
  const refused = (message: RegExp) => (err: unknown) =>
    err instanceof ApiError && err.code === 'INVALID_REQUEST' && message.test(err.message);

  test('a call acting as a user: INVALID_REQUEST, for every file call', async () => {
    const asUser = /acting as a user is not supported by the vm backend/;
    await assert.rejects(files.readFile('sb-x-vm000000', '/etc/passwd', 10, { as: alice }), refused(asUser));
    await assert.rejects(files.writeFile('sb-x-vm000000', '/tmp/x', Buffer.from('x'), 0o644, { as: alice }), refused(asUser));
    await assert.rejects(files.statPath('sb-x-vm000000', '/tmp', { as: alice }), refused(asUser));
    await assert.rejects(files.listDir('sb-x-vm000000', '/tmp', { as: alice }), refused(asUser));
    await assert.rejects(files.makeDir('sb-x-vm000000', '/tmp/d', true, { as: alice }), refused(asUser));
    await assert.rejects(files.removePath('sb-x-vm000000', '/tmp/d', true, { as: alice }), refused(asUser));
    await assert.rejects(files.renamePath('sb-x-vm000000', '/tmp/d', '/tmp/e', { as: alice }), refused(asUser));
  });

  test('metadata, written or asked for: INVALID_REQUEST', async () => {
    const meta = /metadata \(extended attributes\) is not supported by the vm backend/;
    await assert.rejects(
      files.writeFile('sb-x-vm000000', '/tmp/x', Buffer.from('x'), 0o644, { metadata: { prefix: 'user.a.', values: {} } }),
      refused(meta),
    );
    await assert.rejects(files.statPath('sb-x-vm000000', '/tmp', { metadataPrefix: 'user.a.' }), refused(meta));
  });

  test('uid 0 is root: it goes to the VM as before', async () => {
    await assert.rejects(files.statPath('sb-x-vm000000', '/tmp', { as: { uid: 0, gid: 0, groups: [] } }), /the VM must not be reached/);
  });
});
