import { burstScenario } from './burst.js';
import { clusterScenario } from './cluster.js';
import { createScenario } from './create.js';
import { densityScenario } from './density.js';
import { fnCallScenario } from './fncall.js';
import { execScenario } from './exec.js';
import { hardeningScenario } from './hardening.js';
import { lazyScenario } from './lazy.js';
import { migrateScenario } from './migrate.js';
import { pauseScenario } from './pause.js';
import { rolloutScenario } from './rollout.js';
import { snapshotScenario } from './snapshot.js';
import { vmScenario } from './vm.js';
import type { BenchScenarioDef } from './scenario.js';

/** Every `dsec bench` scenario, in the order `dsec bench all` runs them. A new scenario: its module, and a line here. */
export const SCENARIOS: readonly BenchScenarioDef[] = [
  createScenario,
  execScenario,
  densityScenario,
  burstScenario,
  pauseScenario,
  snapshotScenario,
  hardeningScenario,
  vmScenario,
  clusterScenario,
  lazyScenario,
  fnCallScenario,
  rolloutScenario,
  migrateScenario,
];

export function scenarioByName(name: string): BenchScenarioDef {
  const def = SCENARIOS.find((s) => s.name === name);
  if (!def) throw new Error(`unknown scenario ${JSON.stringify(name)}; known: ${SCENARIOS.map((s) => s.name).join(', ')}`);
  return def;
}
