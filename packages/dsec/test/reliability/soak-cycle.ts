/**
 * One soak cycle on a real dsec: create a sandbox, give it mixed work, kill it. The soak and the
 * kill -9 soak run the same cycle; the latter also needs to know which sandboxes the API accepted
 * and which it was asked to kill, so a cycle cut by a crash can still be accounted for.
 *
 * Work: a command, a file written and read back, a shell session, a background process (started,
 * given stdin, killed), pause and resume; every 4th cycle a network switch (open, then none);
 * every 10th a snapshot and a sandbox restored from it (its file checked).
 */
import assert from 'node:assert/strict';
import { Sandbox } from '@dsec/sdk';

/** What a cycle tells its caller about the sandboxes it makes (all optional). */
export interface CycleTracking {
  /** The API accepted a create: it answered with this id. */
  created?(id: string): void;
  /** A kill of `id` is about to be asked for (its answer may be cut). */
  killing?(id: string): void;
  /** The kill of `id` was answered: the sandbox and its record are gone. */
  killed?(id: string): void;
}

/**
 * Cycle `i` against the dsec at `conn`. The connection is fixed for the whole cycle: after a
 * restart (a new port) a cycle begun before it fails instead of going on against the new server.
 */
export async function soakCycle(conn: { url: string; apiKey: string }, i: number, track: CycleTracking = {}): Promise<void> {
  const kill = async (sb: Sandbox): Promise<void> => {
    track.killing?.(sb.id);
    await sb.kill();
    track.killed?.(sb.id);
  };
  const sb = await Sandbox.create({ ...conn, labels: { soak: String(i) } });
  track.created?.(sb.id);
  try {
    const r = await sb.commands.run(`echo cycle-${i}`);
    assert.equal(r.stdout, `cycle-${i}\n`, r.stderr);
    await sb.files.write('/tmp/data.txt', `payload ${i}`);
    assert.equal(new TextDecoder().decode(await sb.files.read('/tmp/data.txt')), `payload ${i}`);
    const s = await sb.sessions.create();
    await s.run('cd /tmp && export N=' + i);
    assert.equal((await s.run('echo $N $(pwd)')).stdout, `${i} /tmp\n`);
    await s.close();
    const p = await sb.commands.start('cat', { stdin: true });
    await p.writeStdin('to cat\n');
    await p.kill();
    await sb.pause();
    await sb.resume();
    if (i % 4 === 0) {
      await sb.setNetwork({ mode: 'open' });
      await sb.setNetwork({ mode: 'none' });
    }
    if (i % 10 === 0) {
      await sb.files.write('/snap.txt', `snapshot ${i}`);
      const snap = await sb.snapshot();
      const restored = await Sandbox.create({ ...conn, image: snap.imageId, labels: { soak: `${i}-restored` } });
      track.created?.(restored.id);
      try {
        assert.equal((await restored.commands.run('cat /snap.txt')).stdout, `snapshot ${i}`);
      } finally {
        await kill(restored);
      }
    }
  } finally {
    await kill(sb);
  }
}
