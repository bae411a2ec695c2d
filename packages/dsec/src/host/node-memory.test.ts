import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { memoryAdmissionError } from '../edge/node/memory-admission.js';
import { cgroupHeadroomBytes, memAvailableBytes, nodeMemory, psiFullAvg10 } from './node-memory.js';

const MIB = 1024 * 1024;
const MEMORY_ROOT = '/sys/fs/cgroup/memory';
const v1Skip =
  process.getuid?.() !== 0
    ? 'needs root (makes a memory cgroup)'
    : !existsSync(join(MEMORY_ROOT, 'memory.limit_in_bytes'))
      ? `no cgroup v1 memory hierarchy at ${MEMORY_ROOT}`
      : false;

describe('node memory: what admission reads', () => {
  test("MemAvailable and PSI full avg10 are read from the kernel's own text", () => {
    assert.equal(memAvailableBytes('MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n'), 1000 * 1024);
    assert.equal(memAvailableBytes('MemTotal: 1 kB\n'), undefined);
    assert.equal(psiFullAvg10('some avg10=12.50 avg60=1.00 avg300=0.00 total=5\nfull avg10=3.25 avg60=0.50 avg300=0.00 total=2\n'), 3.25);
    assert.equal(psiFullAvg10(undefined), undefined);
    // This host's own figures parse (the node is never reported as having nothing).
    // Bounded by MemTotal, which does not move: a second read of MemAvailable after this one may be
    // lower (other processes allocate in between), and comparing with it failed in a full suite.
    const live = nodeMemory();
    const total = Number(/^MemTotal:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1]) * 1024;
    assert.ok(live.availableBytes > 0 && live.availableBytes <= total, `${JSON.stringify(live)} against MemTotal ${total}`);
    if (existsSync('/proc/pressure/memory')) assert.equal(typeof live.fullAvg10, 'number');
  });

  test('a memory cgroup with a limit bounds what is available; one without does not', { skip: v1Skip }, () => {
    const dir = join(MEMORY_ROOT, `dsec-unit-mem-${process.pid}`);
    mkdirSync(dir);
    try {
      assert.equal(cgroupHeadroomBytes(dir), undefined, 'no limit: no bound');
      writeFileSync(join(dir, 'memory.limit_in_bytes'), String(64 * MIB));
      const usage = Number(readFileSync(join(dir, 'memory.usage_in_bytes'), 'utf8'));
      assert.equal(cgroupHeadroomBytes(dir), 64 * MIB - usage);
    } finally {
      rmdirSync(dir);
    }
  });

  test('admission refuses below the floor or at the pressure bound, naming the figure and the option', () => {
    const admission = { minAvailableBytes: 256 * MIB, maxFullPressure: 40 };
    const ok = memoryAdmissionError('e1', admission, { availableBytes: 300 * MIB, source: 'MemAvailable', fullAvg10: 39.9 });
    assert.equal(ok, undefined);
    const short = memoryAdmissionError('e1', admission, { availableBytes: 100 * MIB, source: 'the memory cgroup /x', fullAvg10: 0 });
    assert.equal(short?.code, 'NODE_MEMORY_PRESSURE');
    assert.match(
      short!.message,
      /^edge e1: 100 MiB of memory available \(the memory cgroup \/x\), below the 256 MiB a create needs \(--min-available-memory-mib\)/,
    );
    assert.equal(short!.details['admission'], true);
    const thrashing = memoryAdmissionError('e1', admission, { availableBytes: 4096 * MIB, source: 'MemAvailable', fullAvg10: 40 });
    assert.match(
      thrashing!.message,
      /waited on memory 40% of the last 10 s \(PSI full avg10\), at or above the 40% a create allows \(--max-memory-pressure\)/,
    );
    assert.equal(
      memoryAdmissionError(
        'e1',
        { minAvailableBytes: 0, maxFullPressure: 0 },
        { availableBytes: 0, source: 'MemAvailable', fullAvg10: 100 },
      ),
      undefined,
      '0 turns both off',
    );
  });
});
