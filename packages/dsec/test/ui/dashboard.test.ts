/**
 * The web dashboard end to end: Debian's headless Chromium (driven by playwright-core through its
 * executable path) against a real all-in-one dsec on crun. It signs in, sees a sandbox made
 * through the API appear, filters by label and state, opens the sandbox's page (usage, network,
 * trajectory with output), runs a command in its terminal and reads the output, and watches a
 * batch's progress. DSEC_UI_SCREENSHOTS=DIR also keeps a screenshot of each page there.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { chromium, type Browser, type Locator, type Page } from 'playwright-core';
import { Sandbox } from '@dsec/sdk';
import { UI_DIR } from '../../src/control/routes/ui.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const CHROMIUM = process.env['DSEC_CHROMIUM'] ?? '/usr/bin/chromium';
const SCREENSHOTS = process.env['DSEC_UI_SCREENSHOTS'];

function skipReason(): string | undefined {
  if (!existsSync(CHROMIUM))
    return `the dashboard test needs Chromium at ${CHROMIUM} (Debian's chromium package; scripts/setup installs it)`;
  if (!existsSync(join(UI_DIR, 'index.html'))) return `the dashboard is not built (${UI_DIR}index.html): run ./scripts/setup`;
  return integrationSkipReason();
}

/**
 * Waits until the element's text satisfies `ok` (playwright-core has no expect().toPass, and the
 * page's CSP rightly refuses the string evaluation waitForFunction would need).
 */
async function waitForText(locator: Locator, ok: (text: string) => boolean, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    last = (await locator.textContent()) ?? '';
    if (ok(last)) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.fail(`text never matched; last seen: ${JSON.stringify(last)}`);
}

describe('web dashboard in headless Chromium', { skip: skipReason(), timeout: 180_000 }, () => {
  let server: TestServer;
  let browser: Browser;
  let page: Page;
  let first: Sandbox;
  let second: Sandbox;
  const run = Math.random().toString(36).slice(2, 8);

  const shot = async (name: string): Promise<void> => {
    if (!SCREENSHOTS) return;
    mkdirSync(SCREENSHOTS, { recursive: true });
    await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
  };
  const go = async (hash: string): Promise<void> => {
    await page.goto(`${server.url}/ui/${hash}`);
  };

  before(async () => {
    server = await startTestServer();
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
    page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
    page.setDefaultTimeout(30_000);
  });
  after(async () => {
    await browser?.close();
    await server?.close();
  });

  test('/ui redirects to the app, served with a CSP that allows only this origin', async () => {
    const res = await fetch(`${server.url}/ui`, { redirect: 'manual' });
    assert.equal(res.status, 302);
    assert.equal(new URL(res.headers.get('location') ?? '', res.url).pathname, '/ui/');
    const index = await fetch(`${server.url}/ui/`);
    assert.equal(index.status, 200);
    assert.match(index.headers.get('content-security-policy') ?? '', /script-src 'self'/);
    const html = await index.text();
    assert.doesNotMatch(html, /https?:\/\//, 'index.html loads nothing from another origin');
  });

  test('signs in: an unknown key is refused with a message, the real key opens the overview with this edge', async () => {
    await go('');
    await page.getByLabel('API key').fill('dsec_not-a-key');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByText('That key is not known to this control plane.').waitFor();
    await shot('sign-in');
    await page.getByLabel('API key').fill(server.apiKey);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Overview' }).waitFor();
    await page.locator('[data-testid=edges]').getByText(server.edgeId, { exact: true }).waitFor();
    assert.equal(await page.evaluate("sessionStorage.getItem('dsec.apiKey')"), server.apiKey);
    assert.deepEqual(await page.context().cookies(), [], 'no cookie holds the key');
  });

  test('a sandbox created through the API appears in the list and in the create-rate counter', async () => {
    await go('');
    await page.locator('[data-testid=creates-total]').getByText('0', { exact: true }).waitFor();
    first = await Sandbox.create({
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 64 },
      labels: { suite: `ui-${run}`, role: 'first' },
    });
    second = await Sandbox.create({
      ...server.conn,
      image: 'busybox',
      resources: { memoryMiB: 96 },
      labels: { suite: `ui-${run}`, role: 'second' },
    });
    // The open page sees both creates: the chart samples /metrics every 2 s, the tiles poll the list.
    await waitForText(page.locator('[data-testid=creates-total]'), (t) => Number(t) >= 2);
    await page.locator('[data-testid=count-running] b').getByText('2', { exact: true }).waitFor();
    if (SCREENSHOTS) await page.waitForTimeout(4500); // for the picture only: two more chart samples draw a line
    await shot('overview');
    await page.getByRole('link', { name: 'Sandboxes' }).click();
    await page.locator(`tr[data-sandbox="${first.id}"]`).waitFor();
    await page.locator(`tr[data-sandbox="${second.id}"]`).waitFor();
  });

  test('filters by label and by state', async () => {
    // The list is asked for as a page of the newest, never whole (400,000 every 2 s).
    const asked = page.waitForRequest((r) => r.url().includes('/v1/sandboxes?'));
    await go('#/sandboxes');
    const url = new URL((await asked).url());
    assert.equal(url.searchParams.get('order'), 'newest');
    assert.equal(url.searchParams.get('limit'), '500');
    await page.getByLabel('labels').fill(`suite=ui-${run} role=first`);
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.locator('[data-testid=sandbox-count]').getByText('1 sandbox', { exact: true }).waitFor();
    assert.equal(await page.locator(`tr[data-sandbox="${first.id}"]`).count(), 1);
    assert.equal(await page.locator(`tr[data-sandbox="${second.id}"]`).count(), 0);

    await second.pause();
    await page.getByLabel('labels').fill(`suite=ui-${run}`);
    await page.getByLabel('state').selectOption('paused');
    await page.locator(`tr[data-sandbox="${second.id}"]`).waitFor();
    await page.locator('[data-testid=sandbox-count]').getByText('1 sandbox', { exact: true }).waitFor();
    assert.equal(await page.locator(`tr[data-sandbox="${first.id}"]`).count(), 0);
    assert.match(page.url(), /status=paused/, 'the filter is in the URL');
    await shot('sandboxes-filtered');
    await second.resume();
  });

  test("a sandbox's page: resources, live usage, network policy, its trajectory with outputs", async () => {
    const marker = `traj-${run}`;
    await first.commands.run(['sh', '-c', `echo ${marker}; echo oops >&2; exit 3`]);
    await go(`#/sandboxes?label=suite%3Dui-${run}`);
    await page.getByRole('link', { name: first.id }).click();
    await page.locator('[data-testid=sandbox-status]').getByText('running').waitFor();
    await page.getByLabel('resources').getByText('64 MiB').waitFor();
    await page.locator('[data-testid=usage]').getByText('of 64 MiB').waitFor();
    await page.locator('[data-testid=network]').getByText('none').first().waitFor();
    const step = page.locator('[data-testid=trajectory] li').filter({ hasText: marker });
    await step.locator('pre.stdout').getByText(marker).waitFor();
    await step.locator('pre.stderr').getByText('oops').waitFor();
    await step.getByText('exit 3', { exact: true }).waitFor();
  });

  test('a terminal in the sandbox runs a command and shows its output', async () => {
    await go(`#/sandboxes/${first.id}`);
    await page.getByRole('button', { name: 'Open a terminal' }).click();
    await page.locator('[data-testid=terminal-status]').getByText('connected').waitFor();
    await page.locator('[data-testid=terminal] .xterm-helper-textarea').focus();
    await page.keyboard.type('echo $((6*7))-from-xterm\n');
    await page.locator('[data-testid=terminal] .xterm-rows').getByText('42-from-xterm').waitFor();
    await shot('sandbox');
    await page.keyboard.type('exit\n');
    await page.locator('[data-testid=terminal-status]').getByText('exited with code 0').waitFor();
    // The terminal is a step of the trajectory too.
    await page.locator('[data-testid=trajectory] li').filter({ hasText: 'pty' }).first().waitFor();
  });

  test("a batch's progress: the list and the batch's page follow it to done", async () => {
    const res = await fetch(`${server.url}/v1/batches`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ count: 3, spec: { image: 'busybox', resources: { memoryMiB: 32 }, labels: { suite: `ui-${run}` } } }),
    });
    assert.equal(res.status, 202);
    const batch = (await res.json()) as { id: string };
    await go('#/batches');
    const row = page.locator(`tr[data-batch="${batch.id}"]`);
    await row.getByText('3 running, 0 failed, 3 placed of 3').waitFor();
    await row.getByText('done').waitFor();
    await shot('batches');
    await row.getByRole('link', { name: batch.id }).click();
    await page.getByRole('heading', { name: batch.id }).waitFor();
    await page.locator('td.event-done').waitFor(); // the stream's last event: every item's are drawn before it
    assert.equal(await page.locator('td.event-running').count(), 3, 'one running event per item');
    await shot('batch');
  });

  test('the overview shows a warm pool filling up', async () => {
    const admin = { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' };
    const name = `ui-${run}`;
    const res = await fetch(`${server.url}/v1/pools`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ name, size: 1, image: 'busybox', resources: { memoryMiB: 32 } }),
    });
    assert.equal(res.status, 201, await res.text());
    try {
      await go('');
      await page.locator(`[data-testid=warm-pools] tr[data-pool="${name}"]`).getByRole('cell', { name: '1 / 1', exact: true }).waitFor();
      await shot('overview-pools');
    } finally {
      const del = await fetch(`${server.url}/v1/pools/${name}`, { method: 'DELETE', headers: { authorization: admin.authorization } });
      assert.equal(del.status, 204);
    }
  });

  test('the images page lists the image the sandboxes run', async () => {
    await go('#/images');
    await page
      .locator('[data-testid=images]')
      .getByRole('cell', { name: /^busybox(:latest)?$/ })
      .waitFor();
    await shot('images');
  });

  test('signing out forgets the key', async () => {
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('API key').waitFor();
    assert.equal(await page.evaluate("sessionStorage.getItem('dsec.apiKey')"), null);
  });
});
