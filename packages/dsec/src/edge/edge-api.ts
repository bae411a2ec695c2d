import type { ExecRequest, ExecResult, ImageConfig } from '@dsec/sdk/schema';
import type { LayerDigest } from '../image/layer-store.js';

/** Limits after defaults are applied: every field is set. */
export interface SandboxLimits {
  cpu: number;
  memoryMiB: number;
  pids: number;
}

/** What the control plane asks an edge to run: everything resolved, nothing left to look up. */
export interface EdgeCreateRequest {
  id: string;
  /** Layers bottom first. */
  layers: LayerDigest[];
  config: ImageConfig;
  env: Record<string, string>;
  limits: SandboxLimits;
}

export type EdgeSandboxStatus = 'running' | 'stopped';

export interface EdgeSandbox {
  id: string;
  status: EdgeSandboxStatus;
  pid: number;
  createdAt: string;
}

export interface EdgeInfo {
  id: string;
  sandboxes: number;
  maxSandboxes: number;
}

/**
 * The control plane ↔ edge boundary. The control plane reaches an edge only through this
 * interface: in `dsec up` the Edge object itself implements it in-process; across nodes the
 * same calls go over HTTP. Errors are ApiErrors with registry codes.
 */
export interface EdgeApi {
  info(): Promise<EdgeInfo>;
  createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox>;
  killSandbox(id: string): Promise<void>;
  listSandboxes(): Promise<EdgeSandbox[]>;
  exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult>;
  readFile(id: string, path: string, maxBytes: number): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number>;
}
