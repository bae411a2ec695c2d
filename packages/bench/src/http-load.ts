import { Agent, request } from 'node:http';

export interface LoadResponse {
  status: number;
  body: unknown;
  ms: number;
}

/**
 * Raw HTTP/1.1 to dsec's public API with keep-alive, as a load generator: one socket per client
 * in flight, no SDK layers (its argument checks and error mapping would be the client's cost, not
 * the server's). Each call resolves with the status, the parsed JSON body and its wall time.
 */
export class HttpLoadClient {
  readonly #agent: Agent;
  readonly #host: string;
  readonly #port: number;

  constructor(
    url: string,
    private readonly apiKey: string,
    maxSockets: number,
  ) {
    const u = new URL(url);
    this.#host = u.hostname;
    this.#port = Number(u.port);
    this.#agent = new Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
  }

  call(method: string, path: string, body?: unknown): Promise<LoadResponse> {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const headers: Record<string, string | number> = { authorization: `Bearer ${this.apiKey}` };
    if (payload) {
      headers['content-type'] = 'application/json';
      headers['content-length'] = payload.length;
    }
    const t0 = performance.now();
    return new Promise((resolve, reject) => {
      const req = request({ host: this.#host, port: this.#port, method, path, headers, agent: this.#agent }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let parsed: unknown = text;
          try {
            parsed = text ? JSON.parse(text) : undefined;
          } catch {
            // not JSON: keep the text
          }
          resolve({ status: res.statusCode ?? 0, body: parsed, ms: performance.now() - t0 });
        });
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(payload);
    });
  }

  close(): void {
    this.#agent.destroy();
  }
}
