/**
 * A sandbox's page against the dashboard, in Debian's headless Chromium (red team, round three,
 * finding 7): signed in to the dashboard, the user opens a port link in the same tab. The page,
 * written by whatever runs in the sandbox, tries to read the dashboard's key from sessionStorage,
 * to call the API with the browser's credentials, and to register a service worker scoped over
 * `/` (the dashboard and the API, were it served on their origin). Port links are served on an
 * origin of their own (control/ports/ports-server.ts), so all three fail; the dashboard's origin
 * has no worker afterwards.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { chromium, type Browser, type Page } from 'playwright-core';
import { Sandbox } from '@dsec/sdk';
import { UI_DIR } from '../../src/control/routes/ui.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const CHROMIUM = process.env['DSEC_CHROMIUM'] ?? '/usr/bin/chromium';

function skipReason(): string | undefined {
  if (!existsSync(CHROMIUM))
    return `this test needs Chromium at ${CHROMIUM} (Debian's chromium package; scripts/setup --tests installs it)`;
  if (!existsSync(join(UI_DIR, 'index.html'))) return `the dashboard is not built (${UI_DIR}index.html): run ./scripts/setup`;
  return integrationSkipReason();
}

/** The sandbox's page: what it could take from the dashboard's origin, written where the test reads it. */
const HOSTILE_PAGE = (_api: string): string => `<!doctype html>
<html><body><h1>a sandbox's page</h1>
<script src="probe.js"></script>
</body></html>
`;

/** Served by CGI so its type is JavaScript whatever busybox httpd's MIME table says. */
const CGI_JS = (body: string): string => `#!/bin/sh
echo "Content-Type: text/javascript"
echo "Service-Worker-Allowed: /"
echo
cat <<'JS'
${body}
JS
`;

const PROBE = (api: string): string => `(async () => {
  const out = { origin: location.origin, sessionKeys: Object.keys(sessionStorage), key: sessionStorage.getItem('dsec.apiKey') };
  try {
    const r = await fetch(${JSON.stringify(api)} + '/v1/sandboxes', { credentials: 'include' });
    out.api = 'read ' + r.status;
  } catch (e) {
    out.api = 'blocked';
  }
  try {
    await navigator.serviceWorker.register('cgi-bin/sw.js', { scope: '/' });
    out.worker = 'registered at ' + location.origin;
  } catch (e) {
    out.worker = 'refused: ' + e.name;
  }
  document.body.dataset.result = JSON.stringify(out);
})();`;

describe('a port link cannot reach the dashboard (headless Chromium)', { skip: skipReason(), timeout: 180_000 }, () => {
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let sb: Sandbox;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, image: 'busybox', resources: { memoryMiB: 64 } });
    await sb.files.write('/www/index.html', HOSTILE_PAGE(server.url));
    await sb.files.write('/www/probe.js', PROBE(server.url));
    await sb.files.write('/www/cgi-bin/probe.js', CGI_JS(PROBE(server.url)), { mode: 0o755 });
    await sb.files.write('/www/cgi-bin/sw.js', CGI_JS("self.addEventListener('fetch', () => {});"), { mode: 0o755 });
    await sb.commands.start(['httpd', '-f', '-p', '8080', '-h', '/www']);
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
    page = await browser.newPage();
    page.setDefaultTimeout(30_000);
  });
  after(async () => {
    await browser?.close();
    await server?.close();
  });

  test('signed in, the same tab opens a link: the page sees no key, cannot read the API, and registers no worker over the dashboard', async () => {
    await page.goto(`${server.url}/ui/`);
    await page.getByLabel('API key').fill(server.apiKey);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Overview' }).waitFor();
    assert.equal(await page.evaluate("sessionStorage.getItem('dsec.apiKey')"), server.apiKey, 'the dashboard holds the key in this tab');

    // The page loads its script from cgi-bin (busybox httpd answers .js without a script type).
    await sb.files.write('/www/index.html', HOSTILE_PAGE(server.url).replace('probe.js', 'cgi-bin/probe.js'));
    await sb.ports.wait(8080);
    const link = await sb.ports.link(8080, { ttlSeconds: 120 });
    await page.goto(`${link.url}index.html`);
    await page.locator('body[data-result]').waitFor({ state: 'attached' });
    const result = JSON.parse((await page.locator('body').getAttribute('data-result'))!) as Record<string, unknown>;
    assert.notEqual(result['origin'], new URL(server.url).origin, 'the page runs on the port-link origin');
    assert.equal(result['key'], null, "the dashboard's key is not in the page's sessionStorage");
    assert.deepEqual(result['sessionKeys'], []);
    assert.equal(result['api'], 'blocked', 'the API answers no other origin (no CORS)');
    // Scope '/' is past the script's own path, and the proxy dropped the sandbox's
    // Service-Worker-Allowed: / that would have widened it (on any origin).
    assert.equal(result['worker'], 'refused: SecurityError');

    // Back on the dashboard: no worker controls its origin, and the key is still its own.
    await page.goto(`${server.url}/ui/`);
    await page.getByRole('heading', { name: 'Overview' }).waitFor();
    assert.equal(await page.evaluate('navigator.serviceWorker.getRegistrations().then((r) => r.length)'), 0);
    assert.equal(await page.evaluate('navigator.serviceWorker.controller === null'), true);
  });

  test("the dashboard's CSP admits no script from a link path: the API's origin only redirects link paths away", async () => {
    const link = await sb.ports.link(8080, { ttlSeconds: 120 });
    const path = new URL(link.url).pathname;
    const res = await fetch(`${server.url}${path}cgi-bin/probe.js`, { redirect: 'manual' });
    assert.equal(res.status, 307);
    assert.notEqual(new URL(res.headers.get('location')!).origin, new URL(server.url).origin);
  });
});
