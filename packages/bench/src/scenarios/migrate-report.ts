/** `dsec bench migrate`'s targets (issue 33) and rendering: markdown tables, a chart, terminal lines, headline figures. */
import { renderChart, type ChartPanel } from '../chart-svg.js';
import { mdTable } from '../markdown.js';
import type { BenchReport } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { percentile, round } from '../stats.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import type { MigrateResult, MoveSet } from './migrate-result.js';
import type { HeadlineMetric } from './scenario.js';

const mib = (bytes: number): number => round(bytes / 2 ** 20, 1);
const small = (r: MigrateResult): MoveSet | undefined => r.containers.find((s) => s.writtenMib === TARGETS.migrateContainerMib);

export function migrateTargets(r: MigrateResult): TargetCheck[] {
  const out: TargetCheck[] = [];
  const s = small(r);
  const cTarget = `an idle container with ${TARGETS.migrateContainerMib} MiB written moves in < ${TARGETS.migrateContainerMs} ms (p50)`;
  out.push(
    s && s.moves.length
      ? check(cTarget, s.ms.p50, TARGETS.migrateContainerMs, 'ms', {
          measured: `${s.ms.p50} ms p50 over ${s.moves.length} moves (held ${s.heldMs.p50} ms; the caller waited ${s.callMs.p50} ms)`,
        })
      : { target: cTarget, measured: 'n/a', ok: undefined, note: `no ${TARGETS.migrateContainerMib} MiB container moved in this run` },
  );
  const vTarget = `a microVM with ${TARGETS.migrateVmMemoryMib} MiB moves in < ${TARGETS.migrateVmMs} ms under TCG (p50)`;
  if ('unavailable' in r.vm) out.push({ target: vTarget, measured: 'n/a', ok: undefined, note: r.vm.unavailable });
  else if (r.vm.memoryMiB !== TARGETS.migrateVmMemoryMib || r.vm.moves.length === 0)
    out.push({
      target: vTarget,
      measured: `${r.vm.ms.p50} ms`,
      ok: undefined,
      note: `${r.vm.memoryMiB} MiB guest, ${r.vm.moves.length} moves: not the issue's VM`,
    });
  else {
    const accel = r.vmAccel?.split(' ')[0] ?? '?';
    const c = check(vTarget, r.vm.ms.p50, TARGETS.migrateVmMs, 'ms', {
      measured: `${r.vm.ms.p50} ms p50 over ${r.vm.moves.length} moves (${accel}; held ${r.vm.heldMs.p50} ms, state ${mib(r.vm.bytesP50)} MiB)`,
    });
    out.push(accel === 'TCG' ? c : { ...c, note: `${c.note}; under ${accel}, not TCG` });
  }
  if (r.downtime.length) {
    const failed = r.downtime.reduce((a, d) => a + d.failed, 0);
    const calls = r.downtime.reduce((a, d) => a + d.calls, 0);
    out.push({
      target: 'no call fails while its sandbox moves (the SDK retries SANDBOX_MIGRATING)',
      measured: `${failed} of ${calls} calls failed`,
      ok: failed === 0,
      note:
        failed === 0
          ? 'met'
          : `missed: ${r.downtime
              .flatMap((d) => d.failures)
              .slice(0, 3)
              .join('; ')}`,
    });
  }
  return out;
}

function moveRows(sets: MoveSet[]): (string | number)[][] {
  return sets.map((s) => [
    s.label,
    s.moves.length,
    s.ms.p50,
    s.ms.max,
    s.heldMs.p50,
    s.heldMs.max,
    s.callMs.p50,
    mib(s.bytesP50),
    `${s.verified}/${s.moves.length}`,
  ]);
}

export function renderMigrate(report: BenchReport<MigrateResult>, svgName: string): { markdown: string; svg: string } {
  const r = report.result;
  const o = report.options as unknown as Record<string, number>;
  const md: string[] = [
    '# dsec bench migrate',
    '',
    `Sandboxes moved between two real edges (issue 33): ${r.layout} Edges: ${r.edges.join(', ')}.`,
    '',
    '## Moves',
    '',
    '`ms`: the migrate call to running on the new edge, as the control plane timed it (MigrateResult.ms); `held`: quiesced (frozen, its calls waiting) until running there (heldMs); ' +
      '`caller`: `sandbox.migrate()` as the SDK waited. `verified`: the row names the other edge and the data read back has its checksum (a VM: and its counting process went on).',
    '',
  ];
  const sets = [...r.containers, ...('moves' in r.vm ? [r.vm] : [])];
  md.push(
    mdTable(['sandbox', 'moves', 'ms p50', 'ms max', 'held p50', 'held max', 'caller p50', 'MiB moved (p50)', 'verified'], moveRows(sets)),
    '',
  );
  if ('unavailable' in r.vm) md.push(`microVM: not measured: ${r.vm.unavailable}`, '');
  else if (r.vmAccel) md.push(`microVM accelerator: ${r.vmAccel}.`, '');
  if (r.downtime.length) {
    md.push(
      '## Downtime seen by a polling caller',
      '',
      `A caller calls the sandbox (${o['smallMib']} MiB written afresh before each move) every ${o['pollMs']} ms through the SDK while it moves; the longest time between two successful answers (a poll before the move to one after it), over the moves. ` +
        "`refused`: moves refused SANDBOX_NOT_MIGRATABLE because the poll's `true` was running at the quiesce, tried again.",
      '',
      mdTable(
        ['poll', 'moves', 'longest gap p50 (ms)', 'longest gap max (ms)', 'held p50 (ms)', 'calls', 'failed', 'refused', 'verified'],
        r.downtime.map((d) => [
          d.kind,
          d.moves.length,
          d.longestGapMs.p50,
          d.longestGapMs.max,
          percentile(
            d.moves.map((m) => m.heldMs),
            50,
          ),
          d.calls,
          d.failed,
          d.refused,
          `${d.moves.filter((m) => m.edgeChanged && m.intact).length}/${d.moves.length}`,
        ]),
      ),
      '',
    );
    for (const d of r.downtime) if (d.failures.length) md.push(`Failed calls (${d.kind}): ${d.failures.join('; ')}`, '');
  }
  if ('unavailable' in r.drain) md.push('## Drain with migrate', '', `Not run: ${r.drain.unavailable}`, '');
  else {
    const d = r.drain;
    md.push(
      '## Drain with migrate',
      '',
      `${d.count} idle sandboxes gathered on one edge (${d.fillMoves} placed on the other moved there first, 4 at a time: p50 ${d.fillMs.p50} ms each), then \`POST /v1/nodes/{id}/drain {migrate: true}\` read as NDJSON to its last line.`,
      '',
      mdTable(
        ['sandboxes', 'moved', 'stayed', 'total (s)', 'per move p50 (ms)', 'per move p99 (ms)', 'moved per s', 'verified', 'edge after'],
        [
          [
            d.count,
            d.moved,
            d.stayed.length,
            round(d.totalMs / 1000, 2),
            d.perMove.p50,
            d.perMove.p99,
            round(d.moved / (d.totalMs / 1000), 1),
            `${d.verified}/${d.moved}`,
            d.nodeState,
          ],
        ],
      ),
      '',
    );
    for (const s of d.stayed.slice(0, 5)) md.push(`- stayed ${s.id}: ${s.code} ${s.reason}`);
    if (d.stayed.length) md.push('');
  }
  md.push(...renderCommon(report, svgName));
  const panels: ChartPanel[] = [
    {
      title: 'Move, p50',
      unit: 'ms',
      better: 'lower',
      bars: sets.map((s) => ({ label: s.backend === 'microvm' ? 'microVM' : `${s.writtenMib} MiB`, value: s.ms.p50 })),
      target: { value: TARGETS.migrateContainerMs, label: `${TARGETS.migrateContainerMib} MiB: ${TARGETS.migrateContainerMs} ms` },
    },
    {
      title: 'Held still, p50',
      unit: 'ms',
      better: 'lower',
      bars: sets.map((s) => ({ label: s.backend === 'microvm' ? 'microVM' : `${s.writtenMib} MiB`, value: s.heldMs.p50 })),
    },
  ];
  if (r.downtime.length)
    panels.push({
      title: 'Longest gap a polling caller saw, max',
      unit: 'ms',
      better: 'lower',
      bars: r.downtime.map((d) => ({ label: d.kind === 'exec true' ? 'true' : 'read', value: d.longestGapMs.max })),
    });
  if (!('unavailable' in r.drain))
    panels.push({
      title: `Drain of ${r.drain.count}`,
      unit: 's',
      better: 'lower',
      bars: [{ label: 'total', value: round(r.drain.totalMs / 1000, 2) }],
    });
  return { markdown: md.join('\n'), svg: renderChart('dsec bench migrate', chartSubtitle(report), panels) };
}

export function migrateLines(r: MigrateResult): string[] {
  const out = [...r.containers, ...('moves' in r.vm ? [r.vm] : [])].map(
    (s) =>
      `${s.label.padEnd(40)} ${s.moves.length} moves: p50 ${s.ms.p50} ms (held ${s.heldMs.p50} ms, caller ${s.callMs.p50} ms), ${mib(s.bytesP50)} MiB moved, ${s.verified} verified`,
  );
  if ('unavailable' in r.vm) out.push(`microVM not measured: ${r.vm.unavailable}`);
  for (const d of r.downtime)
    out.push(
      `polling (${d.kind}): longest gap p50 ${d.longestGapMs.p50} ms, max ${d.longestGapMs.max} ms; ${d.failed} of ${d.calls} calls failed; ${d.refused} moves refused and retried`,
    );
  if ('unavailable' in r.drain) out.push(`drain not run: ${r.drain.unavailable}`);
  else
    out.push(
      `drain of ${r.drain.count}: ${r.drain.moved} moved in ${round(r.drain.totalMs / 1000, 2)} s, per move p50 ${r.drain.perMove.p50} ms; ${r.drain.stayed.length} stayed; ${r.drain.verified} verified`,
    );
  return out;
}

export function migrateHeadline(r: MigrateResult): HeadlineMetric[] {
  const out: HeadlineMetric[] = r.containers.map((s) => ({
    metric: `migrate: container with ${s.writtenMib} MiB written, p50 (ms)`,
    better: 'lower' as const,
    values: { dsec: s.ms.p50 },
  }));
  if ('moves' in r.vm)
    out.push({ metric: `migrate: microVM ${r.vm.memoryMiB} MiB, p50 (ms)`, better: 'lower', values: { dsec: r.vm.ms.p50 } });
  if (!('unavailable' in r.drain))
    out.push({ metric: `migrate: drain of ${r.drain.count} (s)`, better: 'lower', values: { dsec: round(r.drain.totalMs / 1000, 2) } });
  return out;
}
