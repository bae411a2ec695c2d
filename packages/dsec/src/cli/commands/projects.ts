import type { Command } from 'commander';
import { Connection } from '@dsec/sdk';
import type { ApiKeyInfo, CreatedKey, ProjectInfo, ProjectQuota, QuotaName, UpdateProjectRequest } from '@dsec/sdk/schema';
import { UsageError, intArg, positiveArg } from '../args.js';
import { printTable } from '../output.js';

interface QuotaFlags {
  sandboxes?: number;
  cpu?: number;
  memory?: number;
  rate?: number;
  clear?: string[];
}

/** Quota flags shared by `project create` and `project set-quota`. */
function quotaOptions(cmd: Command): Command {
  return cmd
    .option('--sandboxes <n>', 'live sandboxes at once (creating, running, paused)', intArg(0))
    .option('--cpu <n>', 'CPUs summed over live sandboxes', (v) => (v === '0' ? 0 : positiveArg(v)))
    .option('--memory <MiB>', 'memory (MiB) summed over live sandboxes', intArg(0))
    .option('--rate <n>', 'sandbox creates per second', positiveArg);
}

function quotaOf(f: QuotaFlags): ProjectQuota {
  const q: ProjectQuota = {};
  if (f.sandboxes !== undefined) q.maxSandboxes = f.sandboxes;
  if (f.cpu !== undefined) q.maxCpu = f.cpu;
  if (f.memory !== undefined) q.maxMemoryMiB = f.memory;
  if (f.rate !== undefined) q.createsPerSecond = f.rate;
  return q;
}

const CLEARABLE: Record<string, QuotaName> = { sandboxes: 'maxSandboxes', cpu: 'maxCpu', memory: 'maxMemoryMiB', rate: 'createsPerSecond' };

function quotaText(q: ProjectQuota): string {
  const parts: string[] = [];
  if (q.maxSandboxes !== undefined) parts.push(`sandboxes ${q.maxSandboxes}`);
  if (q.maxCpu !== undefined) parts.push(`cpu ${q.maxCpu}`);
  if (q.maxMemoryMiB !== undefined) parts.push(`memory ${q.maxMemoryMiB} MiB`);
  if (q.createsPerSecond !== undefined) parts.push(`rate ${q.createsPerSecond}/s`);
  return parts.length ? parts.join(', ') : 'unlimited';
}

function printProjects(projects: ProjectInfo[], json: boolean): void {
  if (json) {
    process.stdout.write(JSON.stringify(projects, null, 2) + '\n');
    return;
  }
  printTable(
    projects.map((p) => ({
      name: p.name,
      quota: quotaText(p.quota),
      sandboxes: p.usage.sandboxes,
      cpu: p.usage.cpu,
      memory: `${p.usage.memoryMiB} MiB`,
      created: p.createdAt,
    })),
    ['name', 'quota', 'sandboxes', 'cpu', 'memory', 'created'],
    false,
  );
}

/**
 * `dsec project create|ls|set-quota` and `dsec key create|ls|revoke` (docs/PROJECTS.md): they
 * take an admin key (client.json's, on the control plane's host), except `project ls`, which any
 * key may run to see its own project's quota and usage.
 */
export function registerProjectCommands(program: Command): void {
  const project = program
    .command('project')
    .description('projects: API keys, sandboxes and private images belong to one; quotas apply per project');
  quotaOptions(project.command('create').description('create a project (admin key)').argument('<name>', 'a-z, 0-9 and -'))
    .option('--json', 'print the project as JSON')
    .action(async (name: string, f: QuotaFlags & { json?: boolean }) => {
      const p = await new Connection().json<ProjectInfo>('POST', '/v1/projects', { json: { name, quota: quotaOf(f) } });
      if (f.json) process.stdout.write(JSON.stringify(p, null, 2) + '\n');
      else
        process.stdout.write(
          `project ${p.name} created (quota: ${quotaText(p.quota)}); mint a key with: dsec key create --project ${p.name}\n`,
        );
    });
  project
    .command('ls')
    .description('projects with quota and usage (an admin key lists all; another key, its own)')
    .option('--json', 'machine-readable output')
    .action(async (f: { json?: boolean }) => {
      const { projects } = await new Connection().json<{ projects: ProjectInfo[] }>('GET', '/v1/projects');
      printProjects(projects, f.json === true);
    });
  quotaOptions(
    project.command('set-quota').description("change a project's quota (admin key): flags given are set, others stay").argument('<name>'),
  )
    .option('--clear <quota...>', `make these unlimited: ${Object.keys(CLEARABLE).join(', ')}`)
    .option('--json', 'print the project as JSON')
    .action(async (name: string, f: QuotaFlags & { json?: boolean }) => {
      const update: UpdateProjectRequest = { quota: quotaOf(f), clear: [] };
      for (const c of f.clear ?? []) {
        const k = CLEARABLE[c];
        if (!k) throw new UsageError(`--clear ${c}: not a quota (one of ${Object.keys(CLEARABLE).join(', ')})`);
        update.clear!.push(k);
      }
      const p = await new Connection().json<ProjectInfo>('PATCH', `/v1/projects/${encodeURIComponent(name)}`, { json: update });
      if (f.json) process.stdout.write(JSON.stringify(p, null, 2) + '\n');
      else process.stdout.write(`project ${p.name}: quota ${quotaText(p.quota)}\n`);
    });

  const key = program.command('key').description('API keys: each belongs to a project; admin keys manage projects and keys');
  key
    .command('create')
    .description('mint an API key for a project (admin key); the key is printed once')
    .requiredOption('--project <name>', 'the project the key acts for')
    .option('--name <name>', 'what the key is for')
    .option('--admin', 'an admin key (manages projects and keys, sees every project)')
    .option('--json', 'print id, key, project as JSON')
    .action(async (f: { project: string; name?: string; admin?: boolean; json?: boolean }) => {
      const k = await new Connection().json<CreatedKey>('POST', '/v1/keys', {
        json: { project: f.project, ...(f.name ? { name: f.name } : {}), ...(f.admin ? { admin: true } : {}) },
      });
      if (f.json) process.stdout.write(JSON.stringify(k, null, 2) + '\n');
      else process.stdout.write(`${k.key}\n`);
      if (!f.json)
        process.stderr.write(`key ${k.id} for project ${k.project}${k.admin ? ' (admin)' : ''}: shown once, keep it (DSEC_API_KEY=...)\n`);
    });
  key
    .command('ls')
    .description('API keys (admin key): id, name, project, admin, revoked')
    .option('--project <name>', 'only this project')
    .option('--json', 'machine-readable output')
    .action(async (f: { project?: string; json?: boolean }) => {
      const q = f.project ? `?project=${encodeURIComponent(f.project)}` : '';
      const { keys } = await new Connection().json<{ keys: ApiKeyInfo[] }>('GET', `/v1/keys${q}`);
      printTable(
        keys.map((k) => ({
          id: k.id,
          name: k.name,
          project: k.project,
          admin: k.admin ? 'yes' : '',
          created: k.createdAt,
          revoked: k.revokedAt ?? '',
        })),
        ['id', 'name', 'project', 'admin', 'created', 'revoked'],
        f.json === true,
      );
    });
  key
    .command('revoke')
    .description('revoke a key (admin key): its next request is refused with 401')
    .argument('<id>', 'key id (see dsec key ls)')
    .action(async (id: string) => {
      await new Connection().request('DELETE', `/v1/keys/${encodeURIComponent(id)}`);
      process.stdout.write(`key ${id} revoked\n`);
    });
}
