import type { ApiKeyInfo, ProjectInfo, ProjectQuota } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { createApiKey } from '../api-keys.js';
import type { ProjectQuotas } from '../project-quotas.js';
import type { StateStore, StoredProject } from '../state-store.js';
import type { Caller } from './callers.js';

/**
 * Projects and API keys (docs/PROJECTS.md). An admin key creates projects, sets their quotas,
 * mints and revokes keys; any key reads its own project (quota and usage). Another project is,
 * for a project's key, one that does not exist.
 */
export class ProjectService {
  constructor(private readonly deps: { store: StateStore; quotas: ProjectQuotas }) {}

  async create(caller: Caller, name: string, quota: ProjectQuota): Promise<ProjectInfo> {
    requireAdmin(caller, 'creating a project');
    if (!(await this.deps.store.projects.insert(name, quota))) {
      throw new ApiError('PROJECT_EXISTS', `project ${name} exists already; change its quota with \`dsec project set-quota\``, {
        project: name,
      });
    }
    return this.#withUsage(await this.#project(name));
  }

  /** The caller's project (an admin key: every project). */
  async list(caller: Caller): Promise<ProjectInfo[]> {
    const all = caller.admin ? await this.deps.store.projects.list() : [await this.#project(caller.project)];
    return Promise.all(all.map((p) => this.#withUsage(p)));
  }

  async get(caller: Caller, name: string): Promise<ProjectInfo> {
    if (!caller.admin && name !== caller.project) throw new ApiError('PROJECT_NOT_FOUND', `no project ${name}`, { project: name });
    return this.#withUsage(await this.#project(name));
  }

  /** Sets the quotas given, removes those named in `clear`; the project's admission starts afresh. */
  async setQuota(caller: Caller, name: string, quota: Partial<ProjectQuota>, clear: (keyof ProjectQuota)[] = []): Promise<ProjectInfo> {
    requireAdmin(caller, 'changing a quota');
    const p = await this.#project(name);
    const next = { ...p.quota, ...quota };
    for (const k of clear) delete next[k];
    await this.deps.store.projects.setQuota(p.name, next);
    this.deps.quotas.reset(p.name);
    return this.#withUsage(await this.#project(p.name));
  }

  async createKey(
    caller: Caller,
    req: { project: string; name?: string; admin?: boolean },
  ): Promise<{ id: string; key: string; project: string; admin: boolean }> {
    requireAdmin(caller, 'creating a key');
    await this.#project(req.project);
    const admin = req.admin ?? false;
    const k = await createApiKey(this.deps.store, req.name ?? `${req.project} key`, { project: req.project, admin });
    return { ...k, project: req.project, admin };
  }

  async listKeys(caller: Caller, project?: string): Promise<ApiKeyInfo[]> {
    requireAdmin(caller, 'listing keys');
    return this.deps.store.keys.list(project);
  }

  /** Revokes a key and every key minted with it (at any depth). */
  async revokeKey(caller: Caller, id: string): Promise<void> {
    requireAdmin(caller, 'revoking a key');
    if (!(await this.deps.store.keys.revoke(id)))
      throw new ApiError('KEY_NOT_FOUND', `no key ${id}; list them with \`dsec key ls\``, { id });
  }

  async #project(name: string): Promise<StoredProject> {
    const p = await this.deps.store.projects.get(name);
    if (!p) throw new ApiError('PROJECT_NOT_FOUND', `no project ${name}; list them with \`dsec project ls\``, { project: name });
    return p;
  }

  async #withUsage(p: StoredProject): Promise<ProjectInfo> {
    return { name: p.name, quota: p.quota, usage: await this.deps.store.projects.usage(p.name), createdAt: p.createdAt };
  }
}

/** Admin-only work: the route declares it (http/access.ts); the service holds it too, for any other caller. */
export function requireAdmin(caller: Caller, what: string): void {
  if (!caller.admin)
    throw new ApiError('FORBIDDEN', `${what} takes an admin key; this key is project ${caller.project}'s (see docs/PROJECTS.md)`, {
      project: caller.project,
    });
}
