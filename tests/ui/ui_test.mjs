// Headless Chromium test of loomd's web view (/ui).
//
// Starts a real loomd and one loom-agent with 2 CPU devices running the real
// loom-worker on loopback, creates a tenant, trains a tiny CPU job to the end,
// then drives the page with playwright-core and Debian's chromium:
//   1. /ui loads and asks for a token; a bad token gets a clear message;
//   2. with a tenant token the jobs list shows the submitted jobs and states;
//   3. the finished job's page draws its loss curve on <canvas> (as many points
//      as the API's series, and pixels in the loss colour), shows events and logs;
//   3b. a running job's log follows and its curves grow; the page cancels it;
//   4. the nodes view lists the node and its 2 devices (and a degraded mark);
//   5. the admin token sees the nodes and is told why the jobs view is empty;
//   6. a token revoked while the page is open sends the user back to sign-in
//      with a message naming the refusal.
// Screenshots go to $LOOM_UI_SCREENSHOTS (e.g. docs/) when set.
//
// Usage: node ui_test.mjs BIN_DIR
// Exit 0 pass, 1 fail, 77 skipped (chromium or node_modules missing: this test
// installs nothing; see tests/ui/README.md).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const BIN = path.resolve(process.argv[2] || '');
const CHROMIUM = process.env.LOOM_CHROMIUM || '/usr/bin/chromium';
const SHOTS = process.env.LOOM_UI_SCREENSHOTS || '';
const ADMIN = 'ui-test-admin-token';
const JOIN = 'ui-test-join-token';
const STEPS = 24;

function skip(why) {
  console.log('SKIP: ' + why);
  process.exit(77);
}

if (!fs.existsSync(CHROMIUM)) skip(CHROMIUM + ' not found (apt-get install -y chromium)');
let chromium;
try {
  chromium = createRequire(path.join(HERE, 'package.json'))('playwright-core').chromium;
} catch (e) {
  skip('playwright-core not installed in tests/ui (cd tests/ui && npm ci)');
}
for (const b of ['loomd', 'loom-agent', 'loom-worker'])
  if (!fs.existsSync(path.join(BIN, b))) skip(b + ' not built in ' + BIN);

class Fail extends Error {}
function check(cond, msg) {
  if (!cond) throw new Fail(msg);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(fn, ms, what) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await sleep(200);
  }
  throw new Fail('timed out after ' + ms + ' ms waiting for ' + what + ' (last: ' +
    (last && last.message ? last.message : JSON.stringify(last)) + ')');
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'loom-ui-'));
const procs = [];
function start(name, args, env) {
  const log = fs.openSync(path.join(tmp, name + '.log'), 'a');
  const p = spawn(path.join(BIN, name), args, { env, stdio: ['ignore', log, log] });
  procs.push(p);
  return p;
}

// A token shard in the .bin format: 256 int32 header (magic 20240520, version 1,
// token count), then uint16 tokens. Text-like repeating phrases so the loss falls.
function writeShard(file, ntok) {
  const buf = Buffer.alloc(256 * 4 + ntok * 2);
  buf.writeInt32LE(20240520, 0);
  buf.writeInt32LE(1, 4);
  buf.writeInt32LE(ntok, 8);
  const phrase = Buffer.from('the quick brown fox jumps over the lazy dog. loom trains models. ');
  let x = 12345;
  for (let i = 0; i < ntok; i++) {
    x = (x * 1103515245 + 12345) & 0x7fffffff;
    const t = x % 10 === 0 ? x % 256 : phrase[i % phrase.length];
    buf.writeUInt16LE(t, 1024 + 2 * i);
  }
  fs.writeFileSync(file, buf);
}

let URL_ = '';
async function call(method, p, body, tok) {
  const r = await fetch(URL_ + p, {
    method,
    headers: Object.assign({ Authorization: 'Bearer ' + tok },
      body ? { 'Content-Type': 'application/json' } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  return { status: r.status, json: text ? JSON.parse(text) : null };
}

function jobSpec(name, dp, data) {
  return {
    name,
    labels: { suite: 'ui' },
    model: { family: 'gpt2', n_layer: 2, n_head: 2, d_model: 32, d_ff: 128, vocab_size: 256,
      seq_len: 32 },
    data: { train: data },
    parallel: { dp, tp: 1, pp: 1 },
    train: { steps: STEPS, global_batch_tokens: 4 * 32 * dp, micro_batch: 4, lr: 3e-3,
      warmup_steps: 2, precision: 'fp32', seed: 7 },
    checkpoint: { every_steps: 12, keep: 1 },
    resources: { device: 'cpu', gpus_per_node: 2 },
    max_retries: 0,
  };
}

async function shot(page, name) {
  if (!SHOTS) return;
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: path.join(SHOTS, name), fullPage: true });
}

async function main() {
  // One OpenMP thread per worker: two ranks share CI's two cores.
  const env = Object.assign({}, process.env, { LOOM_ADMIN_TOKEN: ADMIN, LOOM_JOIN_TOKEN: JOIN,
    OMP_NUM_THREADS: '1' });
  for (const k of ['LOOM_URL', 'LOOM_TOKEN', 'LOOM_CONFIG']) delete env[k];
  const data = path.join(tmp, 'train_000.bin');
  writeShard(data, 65536);
  const dd = path.join(tmp, 'loomd');
  start('loomd', ['--auto-approve', '--listen', '127.0.0.1:0', '--data-dir', dd, '--heartbeat', '1',
    '--store-sync-full', 'false'], env);
  URL_ = (await waitFor(() => fs.existsSync(path.join(dd, 'loomd.addr')) &&
    fs.readFileSync(path.join(dd, 'loomd.addr'), 'utf8').trim(), 10000, 'loomd.addr'));
  start('loom-agent', ['--coordinator', URL_, '--name', 'node-1', '--work-dir',
    path.join(tmp, 'agent'), '--cpu-devices', '2', '--worker', path.join(BIN, 'loom-worker'),
    '--heartbeat-ms', '500', '--retry-max-ms', '500'], env);
  await waitFor(async () => {
    const r = await call('GET', '/v1/nodes', null, ADMIN);
    return r.status === 200 && r.json.nodes.some((n) => n.state === 'ready');
  }, 10000, 'node-1 ready');

  const t = await call('POST', '/v1/tenants', { name: 'acme' }, ADMIN);
  check(t.status === 201 || t.status === 200, 'create tenant: ' + JSON.stringify(t));
  const k = await call('POST', '/v1/tenants/' + t.json.id + '/tokens', {}, ADMIN);
  const k2 = await call('POST', '/v1/tenants/' + t.json.id + '/tokens', {}, ADMIN);
  check(k.json && k.json.token && k2.json && k2.json.token, 'tokens: ' + JSON.stringify(k));
  const TOKEN = k.json.token;

  const sub = await call('POST', '/v1/jobs', jobSpec('tiny-gpt2', 2, data), TOKEN);
  check(sub.status === 201, 'submit: ' + JSON.stringify(sub));
  const jid = sub.json.id;
  const t0 = Date.now();
  const done = await waitFor(async () => {
    const r = await call('GET', '/v1/jobs/' + jid, null, TOKEN);
    if (['failed', 'cancelled'].includes(r.json.state))
      throw new Fail('job ended ' + r.json.state + ': ' + JSON.stringify(r.json));
    return r.json.state === 'succeeded' && r.json;
  }, 90000, 'job ' + jid + ' succeeded');
  console.log('job ' + jid + ' trained ' + STEPS + ' steps on 2 cpu ranks in ' +
    (Date.now() - t0) + ' ms');
  check(done.world_size === 2, 'world size 2');
  const series = (await call('GET', '/v1/jobs/' + jid + '/metrics?rank=0', null, TOKEN)).json
    .series;
  check(series.length === STEPS, 'metrics series has ' + series.length + ' of ' + STEPS +
    ' steps');
  // A second job that cannot be placed (4 ranks, 2 devices): stays queued with a reason.
  const q = await call('POST', '/v1/jobs', Object.assign(jobSpec('waits-for-gpus', 4, data),
    { resources: { device: 'cpu', gpus_per_node: 2 } }), TOKEN);
  const queuedId = q.status === 201 ? q.json.id : null;

  // A fresh profile directory (playwright passes it as --user-data-dir).
  const ctx = await chromium.launchPersistentContext(path.join(tmp, 'chromium-profile'), {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 860 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = ctx.pages()[0] || await ctx.newPage();
    const consoleErrors = [];
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
    page.on('pageerror', (e) => consoleErrors.push(String(e)));
    const failed = []; // responses >= 400 other than the expected 401s
    page.on('response', (r) => {
      // expected refusals: 401 (bad/revoked token), 403 on /v1/jobs for the admin token
      const okRefusal = r.status() === 401 || (r.status() === 403 && /\/v1\/jobs/.test(r.url()));
      if (r.status() >= 400 && !okRefusal) failed.push(r.status() + ' ' + r.url());
    });

    // 1. loads, asks for a token; a bad token gets a clear message.
    const resp = await page.goto(URL_ + '/ui');
    check(resp.status() === 200, '/ui status ' + resp.status());
    check((resp.headers()['content-security-policy'] || '').includes("default-src 'self'"),
      'CSP header on /ui');
    await page.waitForSelector('#login-form', { timeout: 5000 });
    await page.fill('#token', 'not-a-real-token');
    await page.click('#login-form button[type=submit]');
    await page.waitForSelector('#login-error:not([hidden])', { timeout: 5000 });
    const bad = await page.textContent('#login-error');
    check(/refused this token/.test(bad) && /UNAUTHORIZED/.test(bad),
      'bad token message: ' + bad);
    check(await page.evaluate(() => !sessionStorage.getItem('loom.token')),
      'a refused token is not stored');
    await shot(page, 'ui-login.png');

    // 2. jobs list with the submitted jobs.
    await page.fill('#token', TOKEN);
    await page.click('#login-form button[type=submit]');
    await page.waitForSelector('#jobs-table tr[data-job="' + jid + '"] .badge', { timeout: 8000 });
    check(await page.evaluate((t) => sessionStorage.getItem('loom.token') === t, TOKEN),
      'token kept in sessionStorage');
    const state = await page.getAttribute('#jobs-table tr[data-job="' + jid + '"] .badge',
      'data-state');
    check(state === 'succeeded', 'job state in list: ' + state);
    const row = await page.textContent('#jobs-table tr[data-job="' + jid + '"]');
    check(row.includes('tiny-gpt2') && row.includes(STEPS + ' / ' + STEPS),
      'row shows name and progress: ' + row);
    if (queuedId) {
      const qs = await page.getAttribute('#jobs-table tr[data-job="' + queuedId + '"] .badge',
        'data-state');
      check(qs === 'queued', 'unplaceable job is listed as queued: ' + qs);
    }
    await shot(page, 'ui-jobs.png');

    // 3. job page: loss curve drawn from the API's series.
    await page.click('#jobs-table tr[data-job="' + jid + '"] a');
    await page.waitForFunction(() => {
      const c = document.getElementById('chart-loss');
      return c && Number(c.dataset.points) > 0;
    }, null, { timeout: 8000 });
    const drawn = await page.evaluate(() => {
      const c = document.getElementById('chart-loss');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let blue = 0; // the train-loss colour #2f6fde
      for (let i = 0; i < d.length; i += 4)
        if (Math.abs(d[i] - 0x2f) < 30 && Math.abs(d[i + 1] - 0x6f) < 30 &&
            Math.abs(d[i + 2] - 0xde) < 30 && d[i + 3] > 200) blue++;
      return { points: Number(c.dataset.points), blue, w: c.width };
    });
    check(drawn.points === STEPS, 'loss chart points ' + drawn.points + ' != ' + STEPS);
    check(drawn.blue > drawn.w / 2, 'loss curve pixels on the canvas: ' + drawn.blue);
    const tps = await page.getAttribute('#chart-tps', 'data-points');
    check(Number(tps) === STEPS, 'tokens/s chart points ' + tps);
    // per-rank step time: a line per rank (dp 2) in each of compute, exposed comm, data wait,
    // one point per step and rank, equal to the API's own per-rank records
    const ranks = (await call('GET', '/v1/jobs/' + jid + '/metrics', null, TOKEN)).json.ranks;
    for (const [id, key] of [['#chart-compute', 'compute'], ['#chart-comm', 'comm_exposed'],
      ['#chart-data', 'data_wait']]) {
      const want = ranks.filter((r) => Number.isFinite((r.ms || {})[key])).length;
      const got = await page.evaluate((sel) => {
        const c = document.querySelector(sel);
        return c ? { series: Number(c.dataset.series), points: Number(c.dataset.points) } : null;
      }, id);
      check(got && got.series === 2 && got.points === 2 * STEPS && want === 2 * STEPS,
        id + ' per-rank lines: ' + JSON.stringify(got) + ', API rows with ' + key + ': ' + want);
    }
    await page.waitForFunction(() => document.querySelectorAll('#events tbody tr').length >= 3,
      null, { timeout: 5000 });
    const evText = await page.textContent('#events');
    check(evText.includes('succeeded') && evText.includes('running'), 'events: ' + evText);
    await page.waitForFunction(() => {
      const l = document.getElementById('logs');
      return l && l.textContent.length > 0;
    }, null, { timeout: 5000 });
    await shot(page, 'ui-job.png');
    // stdout holds the worker's JSON lines: the log view shows them.
    await page.selectOption('#log-stream', 'stdout');
    await page.waitForFunction(() => document.getElementById('logs').textContent
      .includes('"type":"step"'), null, { timeout: 5000 });

    // 3b. a running job: its log follows (stdout grows while the page is open)
    // and its curves gain points; then cancel it from the page.
    const runSpec = jobSpec('long-run', 2, data);
    runSpec.train.steps = 5000;
    runSpec.checkpoint = { every_steps: 1000, keep: 1 };
    const run = await call('POST', '/v1/jobs', runSpec, TOKEN);
    check(run.status === 201, 'submit long job: ' + JSON.stringify(run));
    await waitFor(async () => (await call('GET', '/v1/jobs/' + run.json.id, null, TOKEN)).json
      .state === 'running', 20000, 'long job running');
    await page.goto(URL_ + '/ui#/job/' + run.json.id);
    await page.waitForSelector('#log-stream', { timeout: 8000 });
    await page.selectOption('#log-stream', 'stdout');
    await page.waitForFunction(() => document.getElementById('logs').textContent
      .includes('"type":"step"'), null, { timeout: 10000 });
    const len1 = await page.evaluate(() => document.getElementById('logs').textContent.length);
    await page.waitForFunction((n) => document.getElementById('logs').textContent.length > n,
      len1, { timeout: 10000 });
    await page.waitForFunction(() => Number(document.getElementById('chart-loss').dataset
      .points) > 0, null, { timeout: 10000 });
    const p1 = Number(await page.getAttribute('#chart-loss', 'data-points'));
    await page.waitForFunction((n) => Number(document.getElementById('chart-loss').dataset
      .points) > n, p1, { timeout: 10000 });
    page.once('dialog', (d) => d.accept());
    await page.click('#cancel');
    await waitFor(async () => ['cancelled', 'cancelling'].includes((await call('GET',
      '/v1/jobs/' + run.json.id, null, TOKEN)).json.state), 10000, 'cancelled from the page');
    await waitFor(async () => (await call('GET', '/v1/jobs/' + run.json.id, null, TOKEN)).json
      .state === 'cancelled', 20000, 'long job cancelled');

    // 4. nodes with their devices; a node check that finds node-1 slow shows up
    // as "degraded" with its reason (skipped when loom-nodecheck is not built).
    let degraded = false;
    if (fs.existsSync(path.join(BIN, 'loom-nodecheck'))) {
      const ck = await call('POST', '/v1/nodes/node-1/check',
        { expect_busbw_gbps: 100000, max_bytes: 65536 }, ADMIN);
      check(ck.status === 202, 'node check: ' + JSON.stringify(ck));
      await waitFor(async () => {
        const r = await call('GET', '/v1/nodechecks/' + ck.json.id, null, ADMIN);
        return r.json.state === 'degraded';
      }, 30000, 'node check marks node-1 degraded');
      degraded = true;
    }
    await page.click('#nav a[data-view=nodes]');
    await page.waitForSelector('#nodes [data-node="node-1"]', { timeout: 8000 });
    const devRows = await page.$$eval('#nodes [data-node="node-1"] tbody tr', (r) => r.length);
    check(devRows === 2, 'node-1 shows 2 devices, got ' + devRows);
    if (degraded) {
      await page.waitForSelector('#nodes [data-node="node-1"] .badge[data-state="degraded"]',
        { timeout: 8000 });
      const card = await page.textContent('#nodes [data-node="node-1"]');
      check(/degraded: all-reduce bus bandwidth/.test(card), 'degraded reason shown: ' + card);
    }
    await shot(page, 'ui-nodes.png');

    // 5. the admin token sees nodes, and every tenant's jobs (GET /v1/jobs answers the admin
    //    with all tenants since f66e3ed), with no error banner.
    await page.click('#signout');
    await page.waitForSelector('#login-form', { timeout: 5000 });
    await page.fill('#token', ADMIN);
    await page.click('#login-form button[type=submit]');
    await page.waitForSelector('#nav:not([hidden])', { timeout: 8000 });
    await page.click('#nav a[data-view=jobs]');
    await page.waitForSelector('#jobs-table tr[data-job="' + jid + '"]', { timeout: 8000 });
    check(await page.isHidden('#banner'), 'admin on jobs view: no error banner');
    await page.click('#nav a[data-view=nodes]');
    await page.waitForSelector('#nodes [data-node="node-1"]', { timeout: 8000 });

    // 6. a token revoked while the page is open: back to sign-in with a message.
    await page.evaluate((t) => sessionStorage.setItem('loom.token', t), k2.json.token);
    await page.goto(URL_ + '/ui#/jobs');
    await page.reload(); // a new page load reads the token from sessionStorage
    await page.waitForSelector('#jobs-table tr[data-job="' + jid + '"]', { timeout: 8000 });
    const rv = await call('DELETE', '/v1/tenants/' + t.json.id + '/tokens/' + k2.json.id, null,
      ADMIN);
    check(rv.status === 200 || rv.status === 204, 'revoke: ' + JSON.stringify(rv));
    await page.waitForSelector('#login-error:not([hidden])', { timeout: 12000 });
    const rmsg = await page.textContent('#login-error');
    check(/refused this token/.test(rmsg), 'revoked token message: ' + rmsg);
    check(!failed.length, 'failed requests: ' + failed.join(' | '));
    const unexpected = consoleErrors.filter((e) => !/401|403|Unauthorized|Forbidden/i.test(e));
    check(!unexpected.length, 'console errors: ' + unexpected.join(' | '));
  } finally {
    await ctx.close();
  }
}

let rc = 0;
try {
  await main();
  console.log('PASS');
} catch (e) {
  console.log('FAIL: ' + (e && e.stack ? e.stack : e));
  for (const f of ['loomd.log', 'loom-agent.log']) {
    try {
      const s = fs.readFileSync(path.join(tmp, f), 'utf8');
      console.log('--- ' + f + ' (tail) ---\n' + s.slice(-3000));
    } catch (x) { /* none */ }
  }
  rc = 1;
} finally {
  for (const p of procs) if (p.exitCode === null) p.kill('SIGTERM');
  await sleep(300);
  for (const p of procs) if (p.exitCode === null) p.kill('SIGKILL');
  if (rc === 0) fs.rmSync(tmp, { recursive: true, force: true });
  else console.log('kept ' + tmp);
}
process.exit(rc);
