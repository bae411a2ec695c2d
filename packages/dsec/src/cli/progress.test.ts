import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Progress, withProgress, type ProgressOutput } from './progress.js';

/** A stream that records what was written; a terminal when `tty` (with a width), a pipe otherwise. */
function output(tty: boolean, columns = 200): ProgressOutput & { text: string } {
  const o = {
    text: '',
    isTTY: tty,
    columns: tty ? columns : undefined,
    write(s: string) {
      o.text += s;
      return true;
    },
  };
  return o;
}

/** What a terminal shows: \r returns to the line start, ESC[K clears the rest of the line. */
function screen(text: string): string[] {
  const lines: string[] = [''];
  for (const part of text.split(/(\r|\n|\x1b\[K)/)) {
    if (part === '\r') lines[lines.length - 1] = '';
    else if (part === '\n') lines.push('');
    else if (part !== '\x1b[K') lines[lines.length - 1] += part;
  }
  return lines;
}

describe('progress', () => {
  test('not a terminal: a line at most every 10 % and at the end, steps and log lines as plain lines', () => {
    const out = output(false);
    const p = new Progress('creating 40 sandboxes', out);
    for (let i = 0; i <= 40; i++) p.update(i, 40, { running: i, failed: 0 });
    p.step('waiting for the last');
    p.log('a line\nanother ');
    p.log('half\n');
    p.end('done');
    const lines = out.text.trimEnd().split('\n');
    assert.equal(lines[0], 'creating 40 sandboxes: 0/40 (0%) running 0, failed 0');
    assert.equal(lines[1], 'creating 40 sandboxes: 4/40 (10%) running 4, failed 0');
    assert.equal(lines[10], 'creating 40 sandboxes: 40/40 (100%) running 40, failed 0');
    assert.deepEqual(lines.slice(11), ['creating 40 sandboxes: waiting for the last', 'a line', 'another half', 'done']);
    assert.doesNotMatch(out.text, /\r|\x1b/, 'no terminal control codes in a log');
  });

  test('a terminal: one status line redrawn in place, with rate and time left; log lines scroll above it', () => {
    let now = 0;
    const out = output(true);
    const p = new Progress('creating 100', out, { now: () => now, tickMs: 0 });
    now = 2000;
    p.update(50, 100, { failed: 1 });
    assert.deepEqual(screen(out.text), ['creating 100 [###############...............] 50/100 50% (failed 1) · 25/s · 2.0 s left']);
    p.log('item 7 failed: out of memory\n');
    now = 4000;
    p.update(100, 100, { failed: 1 });
    p.end();
    assert.deepEqual(screen(out.text), [
      'item 7 failed: out of memory',
      'creating 100 [##############################] 100/100 100% (failed 1) · 25/s',
      '',
    ]);
    assert.match(out.text, /\r[^\n]*\x1b\[K/, 'redrawn with a carriage return and erase-line');
  });

  test('a terminal, no total: a spinner with the step and the elapsed time; a narrow terminal gets one row', () => {
    let now = 0;
    const out = output(true, 40);
    const p = new Progress('building debian', out, { now: () => now, tickMs: 0 });
    now = 12_300;
    p.step('debootstrap --variant=minbase bookworm from a mirror (about a minute)');
    const shown = screen(out.text);
    assert.equal(shown.length, 1);
    assert.ok(shown[0]!.length <= 39, `fits the width: ${shown[0]}`);
    assert.match(shown[0]!, /^⠋ building debian: debootstrap/);
    const wide = new Progress('pulling', output(true), { now: () => now, tickMs: 0 });
    now = 87_300;
    assert.match(wide.render(), /^⠋ pulling \(1m15s\)$/);
    assert.match(p.render(), /…$/);
    wide.end();
    p.end();
  });

  test('withProgress: a started line and a done line with the time when not a terminal', async () => {
    const out = output(false);
    assert.equal(await withProgress('snapshotting sb-1', async () => 42, out), 42);
    assert.match(out.text, /^snapshotting sb-1: started\nsnapshotting sb-1: done in \d+\.\d s\n$/);
    const failed = output(false);
    await assert.rejects(
      withProgress('snapshotting sb-2', async () => Promise.reject(new Error('boom')), failed),
      /boom/,
    );
    assert.match(failed.text, /snapshotting sb-2: failed after/);
  });
});
