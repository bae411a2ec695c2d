/** A sandbox directory tree as text: every path with its type, mode, and md5 or link target. */
import assert from 'node:assert/strict';
import type { Sandbox } from '@dsec/sdk';

export async function treeManifest(sb: Sandbox, dir: string): Promise<string> {
  const script = `cd ${dir} && find . -xdev | sort | while IFS= read -r p; do
    if [ -L "$p" ]; then echo "$p L $(readlink "$p")";
    elif [ -f "$p" ]; then echo "$p F $(stat -c %a "$p") $(md5sum < "$p" | cut -d' ' -f1)";
    elif [ -d "$p" ]; then echo "$p D $(stat -c %a "$p")";
    else echo "$p O"; fi; done`;
  const r = await sb.commands.run(['/bin/sh', '-c', script]);
  assert.equal(r.exitCode, 0, r.stderr);
  return r.stdout;
}
