// The device page of `accelharness web --serve` (web/device_server.py). It runs runner.mjs's own runJob, so a
// device is timed and its EP checked exactly as a browser the harness drives; only the way jobs arrive
// differs: this page says hello with what the browser offers, asks for its device's next job, runs it,
// posts the answer, and repeats. The server stores each answer as it arrives.
//
// One ORT-web runtime per page (runner.mjs): a page load runs the jobs of one setting (EP, threads,
// WebNN device type), then reloads for the next. The tab's page id lives in sessionStorage, so the
// reloaded page is the same holder of the device's lease; a heartbeat worker keeps that lease while
// the main thread is busy measuring.

import { EPS, adapterReport, environmentFacts, runJob, webnnReport } from './runner.mjs';

const API = new URL('../api/', import.meta.url).href;
const PAGE_KEY = 'accelharness-page-id';

class ApiError extends Error {
  constructor(status, message, retryS = null) {
    super(message);
    this.status = status;
    this.retryS = retryS; // a rate limit: the same request may pass after this many seconds
  }
}

let heartbeat = null; // the worker renewing this page's lease
const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function pageId() {
  let id = sessionStorage.getItem(PAGE_KEY);
  if (!id) {
    const bytes = crypto.getRandomValues(new Uint8Array(18));
    id = btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_');
    sessionStorage.setItem(PAGE_KEY, id);
  }
  return id;
}

async function post(path, body) {
  const response = await fetch(API + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new ApiError(response.status, data.error ?? `${path} answered HTTP ${response.status}`, data.retry_s ?? null);
  }
  return data;
}

async function userAgentData() {
  try {
    const hints = ['architecture', 'bitness', 'model', 'platformVersion', 'fullVersionList'];
    return (await navigator.userAgentData?.getHighEntropyValues(hints)) ?? null;
  } catch {
    return null;
  }
}

// What the server names the device by and records with each of its rows.
async function deviceFacts() {
  const facts = await environmentFacts();
  facts.platform = navigator.userAgentData?.platform || navigator.platform || 'unknown';
  facts.device_memory = navigator.deviceMemory ?? null;
  facts.user_agent_data = await userAgentData();
  facts.origin = location.origin;
  facts.adapter = await adapterReport();
  facts.webnn = {};
  for (const type of EPS.webnn.device_types) facts.webnn[type] = await webnnReport(type);
  return facts;
}

function status(text, kind = '') {
  $('status').textContent = text;
  $('status').className = kind;
}

function cell(row, text, className = '') {
  const td = row.insertCell();
  td.textContent = text;
  td.className = className;
}

function timerStep(facts) {
  const ms = facts.timer_resolution_ms;
  return ms < 1 ? `${Math.round(ms * 1000)} µs` : `${ms.toFixed(1)} ms`;
}

function renderDevice(state, facts) {
  $('device').textContent = `${state.device.name} · ${facts.user_agent}`;
  const body = $('eps').tBodies[0];
  body.replaceChildren();
  const isolation = facts.cross_origin_isolated
    ? 'cross-origin isolated'
    : `not cross-origin isolated${facts.secure_context ? '' : ' (not a secure context)'}: threads drop to 1`;
  const rows = [
    ['wasm', `1 and ${facts.hardware_concurrency} threads; ${isolation}; timer step ${timerStep(facts)}`],
  ];
  const gpu = facts.adapter;
  const info = gpu.info ?? {};
  const adapter = [info.vendor, info.architecture, info.description].filter(Boolean).join(' ') || 'an adapter';
  rows.push(['webgpu', gpu.available ? `${adapter}${info.isFallbackAdapter ? ' (software fallback)' : ''}` : gpu.error]);
  for (const [type, found] of Object.entries(facts.webnn)) {
    rows.push([`webnn ${type}`, found.available ? 'context made' : found.error]);
  }
  for (const [ep, here] of rows) {
    const row = body.insertRow();
    cell(row, ep);
    cell(row, here);
  }
}

function renderRun(run) {
  const parts = [
    `models: ${run.models.join(', ')}`,
    `cases: ${run.cases.join(', ')}`,
    `EPs: ${run.hardware.join(', ')}`,
    run.measuring,
  ];
  $('run').textContent = parts.join(' · ');
}

function renderJobs(state) {
  const body = $('jobs').tBodies[0];
  body.replaceChildren();
  for (const job of state.jobs) {
    const row = body.insertRow();
    cell(row, job.label);
    const outcome = job.outcome;
    if (!outcome) {
      cell(row, job.label === state.progress.running ? 'running' : 'waiting', 'muted');
      cell(row, '');
      cell(row, '');
      continue;
    }
    cell(row, outcome.status + (outcome.error ? `: ${outcome.error}` : ''), outcome.status);
    cell(row, outcome.p50_ms == null ? '' : `${outcome.p50_ms.toFixed(3)} ms`, 'num');
    cell(row, outcome.max_abs_diff == null ? '' : outcome.max_abs_diff.toExponential(2), 'num');
  }
  $('bar').max = Math.max(1, state.progress.total);
  $('bar').value = state.progress.done;
}

function startHeartbeat(state) {
  const worker = new Worker(new URL('heartbeat.mjs', import.meta.url), { type: 'module' });
  worker.postMessage({ url: `${API}heartbeat`, page_id: state.page_id, interval_ms: state.heartbeat_s * 1000 });
  return worker;
}

// Ask for jobs until the device has none left. Returns when this page load is done (or reloading).
async function work(id) {
  let setting = null; // the one setting this page load's runtime runs
  let hidden = false;
  document.addEventListener('visibilitychange', () => {
    hidden ||= document.hidden;
  });
  for (;;) {
    const next = await post('next', { page_id: id });
    renderJobs(next);
    if (!next.holding) {
      status(`Waiting: ${next.why}`);
      await sleep(next.wait_s * 1000);
      continue;
    }
    if (!next.job && next.more) continue; // a run that hands its jobs one at a time (ab): the server waited for one
    if (!next.job) {
      status(`Done: all ${next.progress.total} jobs of this device have their results. You can close this tab.`, 'done');
      return 'done';
    }
    if (setting !== null && next.job.setting !== setting) {
      status(`Next: ${next.job.setting}, in a fresh page (one runtime per page)…`);
      location.reload();
      return 'reloading';
    }
    setting = next.job.setting;
    status(`Running ${next.job.label} (${next.progress.done + 1} of ${next.progress.total})…`);
    hidden = document.hidden;
    const answer = await runJob(next.job.run);
    try {
      renderJobs(await post(`result/${next.job.id}`, { page_id: id, answer, page: { hidden } }));
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 409) throw e;
      status(`This page lost its lease (${e.message}); starting again…`);
      location.reload();
      return 'reloading';
    }
  }
}

// Say hello, waiting out the server's rate limit on hellos (a 429 with retry_s); any other refusal stops.
async function hello(id, facts) {
  for (;;) {
    try {
      return await post('hello', { page_id: id, facts });
    } catch (e) {
      if (!(e instanceof ApiError) || e.retryS == null) throw e;
      status(`Waiting: ${e.message}`);
      await sleep(e.retryS * 1000);
    }
  }
}

async function main() {
  const id = pageId();
  status('Probing what this browser offers…');
  const facts = await deviceFacts();
  const state = await hello(id, facts);
  renderDevice(state, facts);
  renderRun(state.run);
  renderJobs(state);
  navigator.wakeLock?.request('screen').catch(() => {}); // keep a phone's screen on while it measures
  heartbeat = startHeartbeat(state);
  heartbeat.onmessage = () => status('This page lost its lease on the device; it will start again after this job.');
  if ((await work(id)) === 'done') heartbeat.terminate();
}

main().catch((e) => {
  heartbeat?.terminate(); // let the lease lapse: the job goes back to the device's queue
  status(`Stopped: ${e.message}. Reload the page to try again.`, 'failed');
  throw e;
});
