/**
 * The reads of `dsec bench cluster --hold` (cluster-hold.ts), each alone with nothing else in
 * flight: a sandbox by id, lists by label (a small selection, and a whole batch in pages), pages
 * of the running sandboxes (the dashboard's tiles link there), /metrics, the dashboard's overview
 * and a finished batch's status.
 *
 * They run in a client process of their own (hold-reads-child.ts), as a user's tool or the
 * dashboard would: the bench's own process filled the hold and keeps its 400,000 ids and the
 * fill's garbage, and a major collection of that heap, landing while a page's answer waited to be
 * read, was counted as the control plane's latency (a page of 1,000 sandboxes is also ~0.5 MB of
 * JSON parsed there).
 */
import { HttpLoadClient } from '../http-load.js';

/** What the reads need of the hold. */
export interface HoldReadsInput {
  url: string;
  apiKey: string;
  /** Ids to get, one at random per read. */
  ids: string[];
  /** The small selection's label (`key=value`). */
  smallLabel: string;
  /** A whole batch's label, listed in pages of `page`. */
  largeLabel: string;
  page: number;
  /** A finished batch, whose status is read. */
  batchId: string;
  /** Paths the dashboard's overview fetches at once. */
  overview: string[];
}

/** Each read's latencies in ms, as measured by the client. */
export interface HoldReadsOutput {
  get: number[];
  listSmall: number[];
  smallSelected: number;
  listLarge: number[];
  largeSelected: number;
  largePages: number;
  /** The first paging of the whole batch, end to end. */
  largeMs: number;
  /** Pages of STATUS_PAGE running sandboxes: the first, and the ones after it by cursor. */
  listStatus: number[];
  metrics: number[];
  metricsText: string;
  overview: number[];
  batchInfo: number[];
}

async function timed(n: number, f: (i: number) => Promise<void>): Promise<number[]> {
  const lat: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await f(i);
    lat.push(performance.now() - t0);
  }
  return lat;
}

function ok(r: { status: number; body: unknown }, what: string): void {
  if (r.status !== 200) throw new Error(`${what}: HTTP ${r.status} ${JSON.stringify(r.body).slice(0, 300)}`);
}

/** Every page of a list by label: each page's latency, and how many it selected. */
async function listPaged(http: HttpLoadClient, label: string, page: number): Promise<{ lat: number[]; selected: number }> {
  const lat: number[] = [];
  let selected = 0;
  let after: string | undefined;
  let paged = true;
  for (;;) {
    const q = `/v1/sandboxes?label=${encodeURIComponent(label)}${paged ? `&limit=${page}` : ''}${after ? `&after=${encodeURIComponent(after)}` : ''}`;
    const r = await http.call('GET', q);
    if (r.status === 400 && paged && lat.length === 0 && JSON.stringify(r.body).includes('limit')) {
      paged = false; // a build whose list does not page: all in one answer
      continue;
    }
    ok(r, `GET ${q}`);
    lat.push(r.ms);
    const body = r.body as { sandboxes: unknown[]; next?: string };
    selected += body.sandboxes.length;
    if (!body.next) return { lat, selected };
    after = body.next;
  }
}

/** A page of a list by status: what the dashboard's tiles link to (`?status=running`), and E2B's list by state. */
export const STATUS_PAGE = 100;

/** `pages` pages of a list by status, one after another by cursor (from the first again at the end): each page's latency. */
async function listByStatus(http: HttpLoadClient, status: string, page: number, pages: number): Promise<number[]> {
  const lat: number[] = [];
  let after: string | undefined;
  while (lat.length < pages) {
    const q = `/v1/sandboxes?status=${status}&limit=${page}${after ? `&after=${encodeURIComponent(after)}` : ''}`;
    const r = await http.call('GET', q);
    ok(r, `GET ${q}`);
    lat.push(r.ms);
    after = (r.body as { next?: string }).next;
  }
  return lat;
}

export async function measureHoldReads(input: HoldReadsInput): Promise<HoldReadsOutput> {
  const http = new HttpLoadClient(input.url, input.apiKey, input.overview.length + 1);
  try {
    const { ids } = input;
    const get = await timed(1000, async () =>
      ok(await http.call('GET', `/v1/sandboxes/${ids[Math.floor(Math.random() * ids.length)]!}`), 'GET sandbox'),
    );
    let smallSelected = 0;
    const listSmall = await timed(50, async () => {
      const r = await http.call('GET', `/v1/sandboxes?label=${encodeURIComponent(input.smallLabel)}`);
      ok(r, `GET /v1/sandboxes?label=${input.smallLabel}`);
      smallSelected = (r.body as { sandboxes: unknown[] }).sandboxes.length;
    });
    const tl = performance.now();
    const large = await listPaged(http, input.largeLabel, input.page);
    const largeMs = performance.now() - tl;
    const largePages = large.lat.length;
    for (let i = 0; i < 2; i++) large.lat.push(...(await listPaged(http, input.largeLabel, input.page)).lat);
    const listStatus = await listByStatus(http, 'running', STATUS_PAGE, 40);
    let metricsText = '';
    const metrics = await timed(20, async () => {
      const r = await http.call('GET', '/metrics');
      ok(r, 'GET /metrics');
      metricsText = String(r.body);
    });
    const overview = await timed(10, async () => {
      await Promise.all(input.overview.map(async (p) => ok(await http.call('GET', p), `GET ${p}`)));
    });
    const batchInfo = await timed(20, async () => ok(await http.call('GET', `/v1/batches/${input.batchId}`), 'GET batch'));
    return {
      get,
      listSmall,
      smallSelected,
      listLarge: large.lat,
      largeSelected: large.selected,
      largePages,
      largeMs,
      listStatus,
      metrics,
      metricsText,
      overview,
      batchInfo,
    };
  } finally {
    http.close();
  }
}
