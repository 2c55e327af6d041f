/* Loom web view. A single-page app over loomd's public REST API only:
 *   #/jobs          jobs with state and progress (GET /v1/jobs, /v1/jobs/{id}/metrics)
 *   #/job/ID        one job: loss, tokens/s, per-GPU utilization and per-rank step time
 *                   (compute, exposed communication, data wait) curves drawn on <canvas>,
 *                   events, logs with follow (GET /v1/jobs/{id}/logs?follow=1)
 *   #/nodes         nodes with their GPUs (GET /v1/nodes)
 * The token is asked once and kept in sessionStorage (this tab only). No external
 * scripts, fonts or CDNs: loomd's Content-Security-Policy allows same origin only. */
'use strict';

const TOKEN_KEY = 'loom.token';
/* API root: the folder above /ui, so a reverse proxy prefix (/loom/ui) still works. */
const BASE = location.pathname.replace(/\/ui(\/.*)?$/, '/');
const FINAL = new Set(['succeeded', 'failed', 'cancelled']);
const COLORS = ['#2f6fde', '#d9482b', '#1f8a4c', '#8e44ad', '#c28a00', '#0f8a9d', '#b03a7a',
  '#5a6b7d'];

let token = sessionStorage.getItem(TOKEN_KEY) || '';
let timer = null;       /* the current view's refresh timer */
let aborter = null;     /* aborts the current view's fetches (log follow) */
let viewSeq = 0;        /* bumps on every route change; stale async work checks it */

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/* GET (or other method) on the API with the bearer token. Throws ApiError with the
 * server's error code and message, or status 0 when loomd cannot be reached. */
async function api(path, opts = {}) {
  let r;
  try {
    r = await fetch(BASE + path, {
      method: opts.method || 'GET',
      headers: { Authorization: 'Bearer ' + (opts.token || token) },
      signal: opts.signal,
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'UNREACHABLE', 'loomd cannot be reached (' + e.message + ')');
  }
  if (opts.raw) {
    if (!r.ok) throw await toError(r);
    return r;
  }
  if (!r.ok) throw await toError(r);
  const text = await r.text();
  return text ? JSON.parse(text) : null;
}

async function toError(r) {
  let code = 'HTTP_' + r.status, msg = r.statusText || 'request failed';
  try {
    const j = await r.json();
    if (j && j.error) {
      code = j.error.code || code;
      msg = j.error.message || msg;
    }
  } catch (e) { /* not JSON */ }
  return new ApiError(r.status, code, msg);
}

/* ---------- small DOM helpers ---------- */

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function badge(state) {
  return h('span', { class: 'badge ' + state, 'data-state': state, text: state });
}

function bar(frac, wide) {
  const fill = h('span');
  fill.style.width = Math.max(0, Math.min(1, frac)) * 100 + '%';
  return h('span', { class: wide ? 'bar wide' : 'bar' }, fill);
}

function fmt(v, digits = 3) {
  if (v === undefined || v === null || Number.isNaN(v)) return '–';
  if (typeof v !== 'number') return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(2);
  if (Number.isInteger(v)) return v.toLocaleString('en-US');
  return v.toFixed(digits);
}

function ago(iso) {
  if (!iso) return '–';
  const s = (Date.now() - Date.parse(iso)) / 1000;
  if (!Number.isFinite(s)) return iso;
  if (s < 60) return Math.max(0, Math.round(s)) + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return iso.replace('T', ' ').replace('Z', ' UTC');
}

function banner(msg, kind) {
  const b = document.getElementById('banner');
  if (!msg) {
    b.hidden = true;
    b.textContent = '';
    return;
  }
  b.hidden = false;
  b.className = kind || '';
  b.textContent = msg;
}

/* Explains an API error in words an operator can act on. */
function explain(e) {
  if (e.status === 0) return e.message + '. Is loomd running?';
  if (e.status === 401)
    return 'loomd refused this token (' + e.code + ': ' + e.message + '). Sign in again with a ' +
      'valid tenant token.';
  if (e.status === 403 && isAdminRefusal(e))
    return 'This is the admin token, which loomd refuses here (' + e.message + '): jobs ' +
      'belong to tenants. Sign in with a tenant token for this.';
  return e.code + ': ' + e.message;
}

function isAdminRefusal(e) {
  return e.status === 403 && /admin/i.test(e.message || '');
}

/* Handles an error of a view's refresh: a rejected token goes back to sign-in. */
function viewError(e) {
  if (e && e.name === 'AbortError') return;
  if (e instanceof ApiError && e.status === 401) {
    signOut(explain(e));
    return;
  }
  banner(e instanceof ApiError ? explain(e) : 'Error: ' + (e && e.message));
}

/* ---------- charts on <canvas> ---------- */

function niceStep(range, target) {
  const raw = range / Math.max(1, target);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const n = raw / mag;
  return (n >= 5 ? 10 : n >= 2 ? 5 : n >= 1 ? 2 : 1) * mag;
}

function tickLabel(v, step) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(step >= 1e6 ? 0 : 1) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(step >= 1e3 ? 0 : 1) + 'k';
  const d = step >= 1 ? 0 : Math.min(4, Math.ceil(-Math.log10(step)));
  return v.toFixed(d);
}

/* Draws line series [{name, color, points: [[x, y], ...], dots}] on a canvas with
 * axes, grid, ticks and a legend. Records what it drew in data-* attributes (series
 * count, point count) so tests and users can tell an empty chart from a drawn one. */
function lineChart(canvas, series, opts = {}) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 600, hgt = canvas.clientHeight || 230;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(hgt * dpr);
  const g = canvas.getContext('2d');
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, hgt);
  g.font = '11px system-ui, sans-serif';
  const pts = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[0]) &&
    Number.isFinite(p[1]));
  canvas.dataset.series = String(series.filter((s) => s.points.length).length);
  canvas.dataset.points = String(pts.length);
  const L = 52, R = 12, T = 22, B = 26;
  const pw = w - L - R, ph = hgt - T - B;
  if (!pts.length) {
    g.fillStyle = '#687385';
    g.textAlign = 'center';
    g.fillText(opts.empty || 'no data yet', w / 2, hgt / 2);
    return;
  }
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => p[1])), y1 = Math.max(...pts.map((p) => p[1]));
  if (opts.yMin !== undefined) y0 = Math.min(y0, opts.yMin);
  if (opts.yMax !== undefined) y1 = Math.max(y1, opts.yMax);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.05;
  if (opts.yMin === undefined) y0 -= pad;
  if (opts.yMax === undefined) y1 += pad;
  const X = (x) => L + ((x - x0) / (x1 - x0)) * pw;
  const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * ph;
  /* grid and ticks */
  g.strokeStyle = '#e6e9ef';
  g.fillStyle = '#687385';
  g.lineWidth = 1;
  const ys = niceStep(y1 - y0, 5);
  g.textAlign = 'right';
  g.textBaseline = 'middle';
  for (let v = Math.ceil(y0 / ys) * ys; v <= y1 + 1e-12; v += ys) {
    g.beginPath();
    g.moveTo(L, Math.round(Y(v)) + 0.5);
    g.lineTo(L + pw, Math.round(Y(v)) + 0.5);
    g.stroke();
    g.fillText(tickLabel(v, ys), L - 6, Y(v));
  }
  const xs = Math.max(1, niceStep(x1 - x0, 6));
  g.textAlign = 'center';
  g.textBaseline = 'top';
  for (let v = Math.ceil(x0 / xs) * xs; v <= x1 + 1e-12; v += xs)
    g.fillText(tickLabel(v, xs), X(v), T + ph + 6);
  g.strokeStyle = '#aab3c2';
  g.strokeRect(L + 0.5, T + 0.5, pw, ph);
  if (opts.xlabel) {
    g.textAlign = 'right';
    g.textBaseline = 'bottom';
    g.fillText(opts.xlabel, L + pw, hgt - 1);
  }
  /* series */
  g.save();
  g.beginPath();
  g.rect(L, T, pw, ph);
  g.clip();
  for (const s of series) {
    const p = s.points.filter((q) => Number.isFinite(q[0]) && Number.isFinite(q[1]));
    g.strokeStyle = g.fillStyle = s.color;
    g.lineWidth = 2;
    if (s.dots || p.length === 1) {
      for (const q of p) {
        g.beginPath();
        g.arc(X(q[0]), Y(q[1]), 3, 0, 2 * Math.PI);
        g.fill();
      }
      continue;
    }
    g.beginPath();
    p.forEach((q, i) => (i ? g.lineTo(X(q[0]), Y(q[1])) : g.moveTo(X(q[0]), Y(q[1]))));
    g.stroke();
  }
  g.restore();
  /* legend */
  g.textAlign = 'left';
  g.textBaseline = 'middle';
  let lx = L;
  for (const s of series) {
    if (!s.points.length) continue;
    g.fillStyle = s.color;
    g.fillRect(lx, 7, 14, 3);
    g.fillStyle = '#1c2330';
    g.fillText(s.name, lx + 18, 9);
    lx += 26 + g.measureText(s.name).width;
  }
}

/* ---------- sign-in ---------- */

function showLogin(message) {
  stopView();
  document.getElementById('nav').hidden = true;
  document.getElementById('signout').hidden = true;
  document.getElementById('who').textContent = '';
  banner(null);
  const view = document.getElementById('view');
  view.replaceChildren(document.getElementById('tpl-login').content.cloneNode(true));
  const err = document.getElementById('login-error');
  if (message) {
    err.hidden = false;
    err.textContent = message;
  }
  const input = document.getElementById('token');
  input.focus();
  document.getElementById('login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const t = input.value.trim();
    err.hidden = true;
    try {
      /* Any valid token (tenant or admin) may read the node list. */
      await api('v1/nodes', { token: t });
    } catch (e) {
      err.hidden = false;
      err.textContent = e instanceof ApiError ? explain(e) : String(e);
      return;
    }
    token = t;
    sessionStorage.setItem(TOKEN_KEY, t);
    if (!location.hash || location.hash === '#/login') location.hash = '#/jobs';
    else route();
  });
}

function signOut(message) {
  token = '';
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(message);
}

/* ---------- routing ---------- */

function stopView() {
  viewSeq++;
  if (timer) clearInterval(timer);
  timer = null;
  if (aborter) aborter.abort();
  aborter = null;
}

function every(ms, fn) {
  const seq = viewSeq;
  const tick = () => { if (seq === viewSeq) fn().catch(viewError); };
  tick();
  timer = setInterval(tick, ms);
}

function route() {
  if (!token) return showLogin();
  stopView();
  banner(null);
  document.getElementById('nav').hidden = false;
  document.getElementById('signout').hidden = false;
  aborter = new AbortController();
  const m = location.hash.match(/^#\/([a-z]+)(?:\/([^/]+))?/) || [];
  const name = m[1] || 'jobs';
  for (const a of document.querySelectorAll('#nav a'))
    a.classList.toggle('active', a.dataset.view === (name === 'job' ? 'jobs' : name));
  const view = document.getElementById('view');
  view.replaceChildren();
  if (name === 'job' && m[2]) return jobView(view, decodeURIComponent(m[2]));
  if (name === 'nodes') return nodesView(view);
  return jobsView(view);
}

/* ---------- jobs ---------- */

/* Latest step record of a job's rank 0 (null when none yet). */
async function lastStep(id, signal) {
  const m = await api('v1/jobs/' + encodeURIComponent(id) + '/metrics?rank=0', { signal });
  const s = (m && m.series) || [];
  return s.length ? s[s.length - 1] : null;
}

function jobsView(view) {
  const stateSel = h('select', { id: 'state-filter', 'aria-label': 'state' },
    h('option', { value: '', text: 'all states' }),
    ['queued', 'starting', 'running', 'cancelling', 'succeeded', 'failed', 'cancelled'].map(
      (s) => h('option', { value: s, text: s })));
  const body = h('tbody');
  const table = h('table', { id: 'jobs-table' },
    h('thead', {}, h('tr', {}, ['job', 'name', 'state', 'progress', 'loss', 'tokens/s', 'GPUs',
      'attempt', 'submitted'].map((c) => h('th', { text: c })))), body);
  const note = h('p', { class: 'muted', id: 'jobs-note' });
  view.append(h('h1', { text: 'Jobs' }),
    h('div', { class: 'toolbar' }, stateSel, h('span', { class: 'muted', text:
      'refreshes every 5 s' })),
    h('section', { class: 'card' }, table, note));
  const progress = new Map(); /* id -> last step record, kept across refreshes */
  const totals = new Map();   /* id -> spec.train.steps (lists omit the spec; it never changes) */
  const seq = viewSeq;
  async function refresh() {
    const q = stateSel.value ? '&state=' + encodeURIComponent(stateSel.value) : '';
    const r = await api('v1/jobs?limit=100' + q, { signal: aborter.signal });
    if (seq !== viewSeq) return;
    const items = (r && r.items) || [];
    /* Step records only for jobs that ran and may have moved since last time. */
    await Promise.all(items.filter((j) => j.state !== 'queued' &&
      !(FINAL.has(j.state) && progress.has(j.id))).slice(0, 40).map(async (j) => {
      try {
        if (!totals.has(j.id)) {
          const full = await api('v1/jobs/' + encodeURIComponent(j.id), { signal: aborter.signal });
          totals.set(j.id, (full.spec && full.spec.train && full.spec.train.steps) || 0);
        }
        progress.set(j.id, await lastStep(j.id, aborter.signal));
      } catch (e) { /* shown without progress */ }
    }));
    if (seq !== viewSeq) return;
    body.replaceChildren(...items.map((j) => jobRow(j, progress.get(j.id), totals.get(j.id))));
    if (!items.length)
      body.append(h('tr', {}, h('td', { colspan: 9, class: 'empty', text: stateSel.value ?
        'no ' + stateSel.value + ' jobs' : 'no jobs yet: submit one with POST /v1/jobs or ' +
        'loomctl submit' })));
    note.textContent = r && r.next_cursor ? 'showing the newest 100 jobs' : '';
  }
  stateSel.addEventListener('change', () => refresh().catch(viewError));
  every(5000, refresh);
}

function jobRow(j, last, steps) {
  steps = steps || 0;
  const done = last ? last.step : 0; /* steps count from 1 */
  let frac = steps ? done / steps : 0;
  if (j.state === 'succeeded') frac = 1;
  const prog = j.state === 'queued'
    ? h('span', { class: 'muted', text: j.pending_reason || 'waiting' })
    : h('span', {}, bar(frac), last || steps ? Math.min(done, steps) + ' / ' + steps : '');
  return h('tr', { 'data-job': j.id },
    h('td', {}, h('a', { href: '#/job/' + encodeURIComponent(j.id), class: 'mono', text: j.id })),
    h('td', { text: j.name }),
    h('td', {}, badge(j.state)),
    h('td', {}, prog),
    h('td', { text: last ? fmt(last.loss, 4) : '–' }),
    h('td', { text: last ? fmt(Math.round(last.tokens_per_s || 0)) : '–' }),
    h('td', { text: j.world_size }),
    h('td', { text: j.attempt }),
    h('td', { title: j.created_at || '', text: ago(j.created_at) }));
}

/* ---------- one job ---------- */

function jobView(view, id) {
  const path = 'v1/jobs/' + encodeURIComponent(id);
  const title = h('h1', {}, 'Job ', h('span', { class: 'mono', text: id }));
  const info = h('dl', { class: 'kv', id: 'job-info' });
  const cancel = h('button', { type: 'button', id: 'cancel', hidden: true, text: 'Cancel job' });
  const cLoss = h('canvas', { class: 'chart', id: 'chart-loss' });
  const cTps = h('canvas', { class: 'chart', id: 'chart-tps' });
  const cUtil = h('canvas', { class: 'chart', id: 'chart-util' });
  /* On cpu devices the agent reports the host's load, not a GPU's busy time
   * (a flat 100 % line while a rank computes): the card is hidden there. */
  const utilCard = h('section', { class: 'card', id: 'card-util' },
    h('h2', { text: 'GPU utilization (%) per rank' }), cUtil);
  /* Every rank's step timing (step = compute + exposed communication + data
   * wait): a straggler shows as one rank's higher compute, a communication-
   * bound layout as exposed communication on every rank. */
  const cCompute = h('canvas', { class: 'chart', id: 'chart-compute' });
  const cComm = h('canvas', { class: 'chart', id: 'chart-comm' });
  const cData = h('canvas', { class: 'chart', id: 'chart-data' });
  const timingCard = h('section', { class: 'card', id: 'card-timing' },
    h('h2', { text: 'Step time per rank (ms): compute · exposed communication · data wait' }),
    h('div', { class: 'grid3' }, cCompute, cComm, cData));
  const events = h('tbody');
  const rankSel = h('select', { id: 'log-rank', 'aria-label': 'rank' });
  const streamSel = h('select', { id: 'log-stream', 'aria-label': 'stream' },
    h('option', { value: 'stderr', text: 'stderr (text)' }),
    h('option', { value: 'stdout', text: 'stdout (JSON lines)' }));
  const follow = h('input', { type: 'checkbox', id: 'log-follow', checked: true });
  const logs = h('pre', { class: 'logs', id: 'logs' });
  view.append(title,
    h('div', { class: 'grid' },
      h('section', { class: 'card' }, h('h2', { text: 'Job' }), info, cancel),
      h('section', { class: 'card' }, h('h2', { text: 'Loss' }), cLoss)),
    h('div', { class: 'grid' },
      h('section', { class: 'card' }, h('h2', { text: 'Tokens per second' }), cTps),
      utilCard),
    timingCard,
    h('section', { class: 'card' }, h('h2', { text: 'Logs' }),
      h('div', { class: 'toolbar' }, rankSel, streamSel,
        h('label', {}, follow, ' follow')), logs),
    h('section', { class: 'card' }, h('h2', { text: 'Events' }),
      h('table', { id: 'events' }, h('thead', {}, h('tr', {},
        ['time', 'from', 'to', 'attempt', 'reason'].map((c) => h('th', { text: c })))), events)));
  const seq = viewSeq;
  let job = null, logCtl = null, evals = [];
  const series = {}; /* rank -> series */

  cancel.addEventListener('click', async () => {
    if (!confirm('Cancel job ' + id + '?')) return;
    try { await api(path + '/cancel', { method: 'POST' }); } catch (e) { viewError(e); }
  });

  async function loadLogs() {
    if (logCtl) logCtl.abort();
    logCtl = new AbortController();
    aborter.signal.addEventListener('abort', () => logCtl && logCtl.abort());
    const ctl = logCtl;
    logs.textContent = '';
    const live = follow.checked && job && !FINAL.has(job.state);
    const q = path + '/logs?rank=' + (rankSel.value || 0) + '&stream=' + streamSel.value +
      (live ? '&follow=1' : '');
    try {
      const r = await api(q, { raw: true, signal: ctl.signal });
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const stick = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
        logs.append(dec.decode(value, { stream: true }));
        if (stick || !live) logs.scrollTop = logs.scrollHeight;
      }
      if (!logs.textContent) logs.textContent = '(no log output yet)';
    } catch (e) {
      if (e.name !== 'AbortError') logs.textContent = e instanceof ApiError ? explain(e) :
        String(e);
    }
  }
  rankSel.addEventListener('change', loadLogs);
  streamSel.addEventListener('change', loadLogs);
  follow.addEventListener('change', loadLogs);

  function renderInfo() {
    const sp = job.spec || {}, m = sp.model || {}, p = sp.parallel || {}, t = sp.train || {};
    const rows = [
      ['name', job.name],
      ['state', badge(job.state)],
      ['attempt', job.attempt + ' (max retries ' + job.max_retries + ')'],
      ['model', (m.family || '') + ' ' + (m.preset || [m.n_layer && m.n_layer + 'L',
        m.d_model && 'd' + m.d_model].filter(Boolean).join(' '))],
      ['parallel', 'dp ' + (p.dp || 1) + ' · tp ' + (p.tp || 1) + ' · pp ' + (p.pp || 1) +
        ' · zero ' + (p.zero_stage || 0) + ' = ' + job.world_size + ' ranks'],
      ['steps', t.steps],
      ['device', (sp.resources && sp.resources.device) || ''],
      ['placement', Array.isArray(job.placement) ? job.placement.map((r) => r.node + ':' +
        r.device).join(', ') : '–'],
      ['submitted', job.created_at], ['started', job.started_at || '–'],
      ['finished', job.finished_at || '–'],
      ['output', h('span', { class: 'mono', text: job.out_dir || '–' })],
    ];
    if (job.pending_reason) rows.splice(2, 0, ['waiting', job.pending_reason]);
    info.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', { text: k }),
      h('dd', {}, v === undefined || v === null ? '–' : v)]));
    cancel.hidden = FINAL.has(job.state) || job.state === 'cancelling';
  }

  function renderCharts() {
    const s0 = series[0] || [];
    const loss = { name: 'train loss', color: COLORS[0], points: s0.map((r) => [r.step, r.loss]) };
    const val = { name: 'val loss', color: COLORS[1], dots: true,
      points: (evals || []).map((r) => [r.step, r.val_loss]) };
    lineChart(cLoss, [loss, val], { xlabel: 'step', empty: 'no steps yet' });
    lineChart(cTps, [{ name: 'tokens/s', color: COLORS[2],
      points: s0.map((r) => [r.step, r.tokens_per_s]) }],
      { xlabel: 'step', yMin: 0, empty: 'no steps yet' });
    const part = (key) => Object.keys(series).map((r) => ({ name: 'rank ' + r,
      color: COLORS[r % COLORS.length],
      points: series[r].filter((x) => x.ms && Number.isFinite(x.ms[key]))
        .map((x) => [x.step, x.ms[key]]) }));
    lineChart(cCompute, part('compute'), { xlabel: 'step · compute', yMin: 0,
      empty: 'no step timing yet' });
    lineChart(cComm, part('comm_exposed'), { xlabel: 'step · exposed comm', yMin: 0,
      empty: 'no step timing yet' });
    lineChart(cData, part('data_wait'), { xlabel: 'step · data wait', yMin: 0,
      empty: 'no data-wait timing (older workers report none)' });
    const cpu = ((job && job.spec && job.spec.resources) || {}).device === 'cpu';
    utilCard.hidden = cpu;
    if (cpu) return;
    const util = Object.keys(series).map((r) => ({ name: 'rank ' + r,
      color: COLORS[r % COLORS.length],
      points: series[r].filter((x) => x.util_pct !== undefined).map((x) => [x.step, x.util_pct]) }));
    lineChart(cUtil, util, { xlabel: 'step', yMin: 0, yMax: 100,
      empty: 'no utilization reported (CPU devices report none)' });
  }

  async function refresh() {
    const first = !job;
    const wasFinal = job && FINAL.has(job.state);
    job = await api(path, { signal: aborter.signal });
    if (seq !== viewSeq) return;
    renderInfo();
    if (wasFinal && !first) return; /* nothing changes any more */
    const world = Math.min(job.world_size || 1, 16);
    if (first) {
      rankSel.replaceChildren(...Array.from({ length: job.world_size || 1 }, (_, r) =>
        h('option', { value: r, text: 'rank ' + r })));
    }
    const [ev, ...ms] = await Promise.all([
      api(path + '/events', { signal: aborter.signal }),
      ...Array.from({ length: world }, (_, r) => api(path + '/metrics?rank=' + r,
        { signal: aborter.signal }).catch(() => null)),
    ]);
    if (seq !== viewSeq) return;
    ms.forEach((m, r) => { series[r] = (m && m.series) || []; });
    evals = (ms[0] && ms[0].evals) || [];
    renderCharts();
    events.replaceChildren(...((ev && ev.items) || []).map((e) => h('tr', {},
      h('td', { class: 'mono', text: e.at }), h('td', { text: e.from || '–' }),
      h('td', {}, badge(e.to)), h('td', { text: e.attempt }), h('td', { text: e.reason }))));
    if (first) loadLogs();
  }
  window.addEventListener('resize', () => { if (seq === viewSeq && job) renderCharts(); },
    { signal: aborter.signal });
  every(3000, refresh);
}

/* ---------- nodes ---------- */

function nodesView(view) {
  const list = h('div', { id: 'nodes' });
  const summary = h('p', { class: 'muted', id: 'nodes-summary' });
  view.append(h('h1', { text: 'Nodes' }), summary, list);
  const seq = viewSeq;
  async function refresh() {
    const r = await api('v1/nodes', { signal: aborter.signal });
    if (seq !== viewSeq) return;
    const nodes = (r && r.nodes) || [];
    let used = 0, total = 0;
    for (const n of nodes) { used += n.devices_used || 0; total += n.devices_total || 0; }
    summary.textContent = nodes.length + ' node' + (nodes.length === 1 ? '' : 's') + ', ' +
      used + ' of ' + total + ' devices in use · refreshes every 5 s';
    if (!nodes.length) {
      list.replaceChildren(h('section', { class: 'card empty', text:
        'no nodes have joined: start loom-agent --coordinator URL on a node' }));
      return;
    }
    list.replaceChildren(...nodes.map(nodeCard));
  }
  every(5000, refresh);
}

function nodeCard(n) {
  const rows = (n.devices || []).map((d, i) => {
    const memFrac = d.mem_total_mib ? d.mem_used_mib / d.mem_total_mib : 0;
    return h('tr', {},
      h('td', { text: d.index !== undefined ? d.index : i }),
      h('td', { text: d.name || n.gpu_model || n.kind }),
      h('td', {}, bar((d.util_pct || 0) / 100), (d.util_pct || 0) + ' %'),
      h('td', {}, d.mem_total_mib ? [bar(memFrac), fmt(d.mem_used_mib / 1024, 1) + ' / ' +
        fmt(d.mem_total_mib / 1024, 1) + ' GiB'] : '–'),
      h('td', { text: d.temp_c ? d.temp_c + ' °C' : '–' }),
      h('td', { text: d.power_w ? d.power_w + ' W' : '–' }),
      h('td', {}, d.task ? h('a', { class: 'mono', href: '#/job/' +
        encodeURIComponent(d.task.split('/')[0]), text: d.task }) : h('span', { class: 'muted',
        text: 'free' })));
  });
  return h('section', { class: 'card node', 'data-node': n.name },
    h('h2', {}, n.name + ' ', badge(n.state), ' ',
      h('span', { class: 'muted', text: (n.gpu_model || n.kind) + ' · ' + n.devices_used + '/' +
        n.devices_total + ' used · heartbeat ' + ago(n.last_heartbeat) })),
    ((n.health && n.health.reasons) || []).map((r) => h('p', { class: 'error', text:
      'degraded: ' + r })),
    n.health && n.health.checking ? h('p', { class: 'muted', text: 'node check running' }) : null,
    n.health && n.health.last_check ? h('p', { class: 'muted', text: 'last node check ' +
      n.health.last_check.state + ' ' + ago(n.health.last_check.finished_at) }) : null,
    h('table', {}, h('thead', {}, h('tr', {}, ['#', 'device', 'utilization', 'memory', 'temp',
      'power', 'task'].map((c) => h('th', { text: c })))), h('tbody', {}, rows)));
}

/* ---------- start ---------- */

document.getElementById('signout').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
document.getElementById('who').textContent = '';
route();
