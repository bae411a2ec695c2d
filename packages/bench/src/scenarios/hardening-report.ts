/** `dsec bench hardening`'s targets and rendering: tables of the arms side by side, the chart. */
import { round } from '../stats.js';
import { renderChart, type ChartPanel } from '../chart-svg.js';
import { mdTable, ratio } from '../markdown.js';
import type { BenchReport } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import type { LatencySummary } from '../latency.js';
import type { ArmResult, HardeningOptions, HardeningResult } from './hardening-result.js';

export const p50 = (arms: ArmResult[], label: string): number => arms.find((a) => a.label === label)?.latency.p50 ?? NaN;

export function hardeningTargets(r: HardeningResult): TargetCheck[] {
  // dsec's defences as its edge applies them: the seccomp filter precompiled ('crun bpf'); runs
  // from before that arm existed judge crun compiling the profile.
  const hardenedArm = r.create.some((a) => a.label === 'crun bpf') ? 'crun bpf' : 'crun';
  const hardened = p50(r.create, hardenedArm);
  const bareP50 = p50(r.create, 'crun bare');
  const cost = (hardened / bareP50 - 1) * 100;
  const network = p50(r.create, 'dsec+net') - p50(r.create, 'dsec');
  return [
    check(
      `hardening adds ≤ ${TARGETS.hardeningCreatePct}% to create p50 (${hardenedArm} with dsec defaults vs bare, same run)`,
      cost,
      TARGETS.hardeningCreatePct,
      '%',
      {
        measured: `${round(hardened, 2)} ms vs ${round(bareP50, 2)} ms = ${round(cost, 1)}%`,
      },
    ),
    check(
      `a network policy adds ≤ ${TARGETS.networkCreateMs} ms to create p50 (dsec+net vs dsec, same run)`,
      network,
      TARGETS.networkCreateMs,
      'ms',
      {
        measured: `${round(p50(r.create, 'dsec+net'), 2)} ms vs ${round(p50(r.create, 'dsec'), 2)} ms = +${round(network, 2)} ms`,
      },
    ),
    check(
      `policy switch in force ≤ ${TARGETS.policySwitchMs} ms (PUT /network round trip, p50)`,
      r.switch.put.p50,
      TARGETS.policySwitchMs,
      'ms',
    ),
  ];
}

/** Each pair side by side: without and with a user namespace, raw crun and dsec. */
function usernsTable(r: HardeningResult): string {
  const arm = (arms: ArmResult[], label: string): LatencySummary | undefined => arms.find((a) => a.label === label)?.latency;
  const rows: (string | number)[][] = [];
  for (const [what, arms, off, on] of [
    ['create', r.create, 'crun', 'crun userns'],
    ['create', r.create, 'dsec no-userns', 'dsec'],
    ['exec', r.exec, 'crun', 'crun userns'],
    ['exec', r.exec, 'dsec no-userns', 'dsec'],
  ] as const) {
    const a = arm(arms, off);
    const b = arm(arms, on);
    if (!a || !b) continue;
    rows.push([what, off, a.p50, a.p95 ?? NaN, b.p50, b.p95 ?? NaN, ratio(b.p50, a.p50), ratio(b.p95 ?? NaN, a.p95 ?? NaN)]);
  }
  return mdTable(
    ['op', 'peer', 'p50 without (ms)', 'p95 without (ms)', 'p50 userns (ms)', 'p95 userns (ms)', 'p50 ratio', 'p95 ratio'],
    rows,
  );
}

function armTable(arms: ArmResult[], base: string): string {
  const b = p50(arms, base);
  return mdTable(
    ['arm', 'what', 'p50 (ms)', 'p90 (ms)', 'p99 (ms)', `p50 ÷ ${base}`],
    arms.map((a) => [a.label, a.what, a.latency.p50, a.latency.p90, a.latency.p99, ratio(a.latency.p50, b)]),
  );
}

export function renderHardening(report: BenchReport<HardeningResult>, svgName: string): { markdown: string; svg: string } {
  const r = report.result;
  const o = report.options as unknown as HardeningOptions;
  const bars = (arms: ArmResult[]): ChartPanel['bars'] => arms.map((a) => ({ label: a.label, value: a.latency.p50 }));
  const s = r.switch;
  const svg = renderChart(`dsec bench hardening — ${report.startedAt}`, chartSubtitle(report), [
    { title: 'create p50, with and without defences', unit: 'ms', better: 'lower', bars: bars(r.create) },
    { title: 'exec p50, with and without Landlock', unit: 'ms', better: 'lower', bars: bars(r.exec) },
    {
      title: 'policy switch p50',
      unit: 'ms',
      better: 'lower',
      bars: [
        { label: 'PUT', value: s.put.p50 },
        { label: 'edge', value: s.applied.p50 },
        { label: 'nsenter', value: s.nsenterNft.p50 },
        { label: '1st link', value: s.firstAttach.p50 },
      ],
      target: { value: TARGETS.policySwitchMs, label: `target ${TARGETS.policySwitchMs} ms` },
    },
  ]);
  const md = [
    `# dsec bench hardening — ${report.startedAt}`,
    '',
    `What dsec's defences cost. Creates: ${o.count} per arm, one at a time, each removed right after (untimed), ` +
      `in ${o.rounds} rounds with the arms alternating. Execs: ${o.count} per arm on one idle sandbox each. ` +
      "Seccomp and the other OCI-level defences are measured on the raw crun floor (dsec's own config with them stripped), " +
      "where their cost lands; the network policy and Landlock through dsec's API.",
    '',
    '## Create',
    '',
    armTable(r.create, 'crun bare'),
    '',
    '## Exec',
    '',
    armTable(r.exec, 'crun'),
    '',
    '## User namespaces (DSEC_USERNS; on by default, dsec no-userns is the opt-out)',
    '',
    usernsTable(r),
    '',
    '## Network policy switch',
    '',
    mdTable(
      ['what', 'p50 (ms)', 'p90 (ms)', 'p99 (ms)', 'n'],
      [
        [
          'PUT /network none ⇄ allow, round trip (SDK → control plane → edge → libnftables, in force on return)',
          s.put.p50,
          s.put.p90,
          s.put.p99,
          s.put.count,
        ],
        ["the edge's own time for those switches (appliedMs)", s.applied.p50, s.applied.p90, s.applied.p99, s.applied.count],
        [
          'before: `nsenter --net nft -f -` with the same ruleset (the old way, same sandbox)',
          s.nsenterNft.p50,
          s.nsenterNft.p90,
          s.nsenterNft.p99,
          s.nsenterNft.count,
        ],
        [
          'first switch away from none (adds the veth link: one rtnetlink request to dsec-nft; then the ruleset)',
          s.firstAttach.p50,
          s.firstAttach.p90,
          s.firstAttach.p99,
          s.firstAttach.count,
        ],
      ],
    ),
    '',
    `Enforcement check after the last switch to none: \`nc\` from inside got: ${s.enforcement}.`,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}
