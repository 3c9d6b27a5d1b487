// The benchmark page. One ORT-web runtime per page: ort.env.wasm.numThreads and the EP's device are
// fixed when the runtime starts, so the harness opens a fresh page per (EP, threads) setting.
// Everything timed is timed here with performance.now(); Python only sends jobs and reads answers.

import { measureGeneration, passageScores } from './generate.mjs';
import { seq2seqOnce } from './seq2seq.mjs';
import { loopStop } from './stop.mjs';
import { timerStep, wasmTierProbe } from './tier.mjs';

const ORT_BASE = new URL('../ort/', import.meta.url).href;
// The one table of browser EPs (web/page/eps.json, read by Python too): bundle, setup, placement, check.
export const EPS = await (await fetch(new URL('eps.json', import.meta.url))).json();
// The one table of page runtimes (web/page/runtimes.json, read by web/runtimes.py): onnxruntime-web is this
// file's own loop; another runs from its module in runtimes/ (web/page/runtimes/<module>).
export const RUNTIMES = await (await fetch(new URL('runtimes.json', import.meta.url))).json();
const OWN_RUNTIME = 'onnxruntime-web';
const PAGE_MEMORY_TIMEOUT_MS = 2000;
// Set (?chunk=BYTES) when files arrive through Playwright's routing from a remote browser: one large
// route.fulfill over a DevTools connection takes time quadratic in its size (8 MB: 10 s), so large
// files are fetched as byte ranges of this size instead.
const CHUNK_BYTES = Number(new URLSearchParams(location.search).get('chunk') ?? 0);
const PARALLEL_RANGES = 4;
const LOG_LIMIT = 5000;
const logs = [];
let traceLines = null; // while ORT prints a profile: its lines, kept apart from (and not counted in) the log
captureConsole();

// A one-node (Identity) ONNX model. Creating a session on it starts the wasm runtime and the EP, so the
// real model's session-create time (load_ms) is not inflated by fetching and compiling the wasm binary.
const INIT_MODEL_B64 =
  'CAgSDGFjY2VsaGFybmVzczo6ChAKAXgSAXkiCElkZW50aXR5EgRpbml0Wg8KAXgSCgoICAESBAoCCAFiDwoBeRIKCggIARIECgIIAUIECgAQDQ==';

const TYPED_ARRAYS = {
  float32: Float32Array,
  float16: Uint16Array,
  float64: Float64Array,
  int64: BigInt64Array,
  int32: Int32Array,
  int16: Int16Array,
  int8: Int8Array,
  uint64: BigUint64Array,
  uint32: Uint32Array,
  uint16: Uint16Array,
  uint8: Uint8Array,
  bool: Uint8Array,
};

let ort = null;
let runtime = null; // {ep, threads, option, init_ms, facts}
const sessions = new Map(); // model_url -> {session, load_ms, fetch_ms, placement}

// The EP cannot run in this browser at all (no adapter, no WebNN context): recorded as 'unsupported'.
class Unsupported extends Error {}
// The WebGPU device did not answer the trivial dispatch within its deadline (harness.web.device_probe).
class NoProgress extends Unsupported {}

function captureConsole() {
  // ORT-web reports fallbacks (threads, node placement, removed EPs) only on the console: keep them.
  for (const level of ['log', 'info', 'warn', 'error', 'debug']) {
    const original = console[level].bind(console);
    console[level] = (...args) => {
      if (traceLines && level === 'log') return void traceLines.push(args.map(String).join(' '));
      if (logs.length < LOG_LIMIT) logs.push(`[${level}] ${args.map(String).join(' ')}`);
      original(...args);
    };
  }
}

function errorText(e) {
  if (e instanceof Unsupported) return e.message;
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

function toBase64(bytes) {
  if (bytes.toBase64) return bytes.toBase64();
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function fromBase64(text) {
  if (Uint8Array.fromBase64) return Uint8Array.fromBase64(text);
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

async function fetchRange(url, start, end) {
  const response = await fetch(url, { headers: { Range: `bytes=${start}-${end - 1}` } });
  if (!response.ok) throw new Error(`GET ${url} (bytes ${start}-${end - 1}) answered ${response.status}`);
  return response;
}

async function fetchBytes(url) {
  if (!CHUNK_BYTES) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(`GET ${url} answered ${response.status}`);
    return new Uint8Array(await response.arrayBuffer());
  }
  const first = await fetchRange(url, 0, CHUNK_BYTES);
  const head = new Uint8Array(await first.arrayBuffer());
  if (first.status !== 206) return head; // the whole file in one answer
  const bytes = new Uint8Array(Number(first.headers.get('Content-Range').split('/')[1]));
  bytes.set(head, 0);
  const starts = [];
  for (let start = CHUNK_BYTES; start < bytes.length; start += CHUNK_BYTES) starts.push(start);
  for (let i = 0; i < starts.length; i += PARALLEL_RANGES) {
    const batch = starts.slice(i, i + PARALLEL_RANGES).map(async (start) => {
      const part = await fetchRange(url, start, Math.min(start + CHUNK_BYTES, bytes.length));
      bytes.set(new Uint8Array(await part.arrayBuffer()), start);
    });
    await Promise.all(batch);
  }
  return bytes;
}

function adapterInfo(info) {
  if (!info) return null;
  // type, driver and backend exist with --enable-webgpu-developer-features (the harness's launches set it)
  const fields = ['vendor', 'architecture', 'device', 'description', 'isFallbackAdapter', 'type', 'driver', 'backend'];
  return Object.fromEntries(fields.filter((k) => info[k] !== undefined).map((k) => [k, info[k]]));
}

// Whether this browser's wasm reaches its optimizing tier (tier.mjs): probed once per page load, before the first
// job times anything; every job's facts carry the same answer (wasm_tier, or null and why: wasm_tier_error).
const TIER_ERROR_CHARS = 300;
let tierProbe = null;

function wasmTier() {
  tierProbe ??= wasmTierProbe().then(
    (found) => ({ wasm_tier: found }),
    (e) => ({ wasm_tier: null, wasm_tier_error: errorText(e).slice(0, TIER_ERROR_CHARS) }),
  );
  return tierProbe;
}

export async function environmentFacts() {
  const tier = await wasmTier();
  return {
    ...tier,
    cross_origin_isolated: self.crossOriginIsolated,
    // Plain HTTP on a non-loopback origin is not a secure context: no WebGPU, no WebNN, no isolation.
    secure_context: self.isSecureContext,
    hardware_concurrency: navigator.hardwareConcurrency,
    shared_array_buffer: typeof SharedArrayBuffer !== 'undefined',
    webassembly: typeof WebAssembly === 'object',
    webgpu_api: 'gpu' in navigator,
    webnn_api: 'ml' in navigator,
    user_agent: navigator.userAgent,
    timer_resolution_ms: timerStep(20, Infinity),
  };
}

// Why an API the browser may have is missing from this page: an insecure origin hides WebGPU and WebNN.
function missing(api, what) {
  if (self.isSecureContext) return `${api} is undefined: ${what}`;
  return `${api} is undefined: ${location.origin} is not a secure context (plain HTTP off loopback); serve over HTTPS`;
}

async function requestAdapter() {
  if (!navigator.gpu) throw new Unsupported(missing('navigator.gpu', 'this browser exposes no WebGPU'));
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Unsupported('navigator.gpu.requestAdapter() returned null: no WebGPU adapter');
  // Chromium moved isFallbackAdapter from the adapter to adapter.info; read both.
  const info = adapterInfo(adapter.info) ?? {};
  info.isFallbackAdapter = info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? null;
  return { adapter, info };
}

// A WebGPU device that makes no progress (Mesa's lavapipe behind Chromium's `--gpu on` with no GPU) never
// fails: every ORT call on it waits until Python's --timeout. So before a WebGPU page loads a model it proves
// the device once: an adapter, then a one-workgroup compute shader writing a buffer that is mapped back,
// each step under the EP's deadline (eps.json's device_probe_s). A failure stays for the page's life, so its
// later jobs fail at once. Python asks for the two steps apart (probeAdapter, then proveDevice) and waits for
// each with its own limit: a page whose main thread is stuck cannot report, but the adapter it found can be.
const PROBE_WORDS = 64;
const PROBE_SHADER = `@group(0) @binding(0) var<storage, read_write> words: array<u32>;
@compute @workgroup_size(${PROBE_WORDS}) fn main(@builtin(global_invocation_id) id: vec3<u32>) {
  words[id.x] = id.x * 3u + 1u;
}`;
let adapterProbe = null; // the promise of this page's one adapter, {adapter, info}: probed, reported, proved
let deviceProof = null; // the promise of this page's trivial dispatch on it
const deviceProbe = {}; // what the probe found so far (read synchronously into every answer's facts)
// Test-only (tests/test_web.py): the page faults 'stall' and 'hang', inside the dispatch.
const DEVICE_FAULTS = { device_stall: 'stall', device_hang: 'hang' };

// "vendor architecture: description", as harness.web.adapter.adapter_name writes it.
function adapterLabel(info) {
  const head = [info.vendor, info.architecture].filter(Boolean).join(' ');
  const tail = info.description || info.device || '';
  return head && tail ? `${head}: ${tail}` : head || tail || 'an adapter that gives no name';
}

// `why(seconds)` is called only when the deadline passes, so it names what was found by then.
function withDeadline(promise, ep, why) {
  const seconds = EPS[ep].device_probe_s;
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new NoProgress(why(seconds))), seconds * 1000);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// The table's WebGPU EP: its deadline bounds the page's adapter request whoever asks (adapterReport too).
const WEBGPU_EP = Object.keys(EPS).find((name) => EPS[name].setup === 'webgpu-adapter');

function probeAdapter(ep = WEBGPU_EP) {
  deviceProbe.deadline_s = EPS[ep].device_probe_s;
  adapterProbe ??= withDeadline(requestAdapter(), ep, (s) => `navigator.gpu.requestAdapter() made no progress in ${s} s`);
  return adapterProbe.then((found) => {
    deviceProbe.adapter = found.info;
    return found;
  });
}

async function dispatch(adapter, fault) {
  const started = performance.now();
  const device = await adapter.requestDevice();
  const module = device.createShaderModule({ code: PROBE_SHADER });
  const pipeline = await device.createComputePipelineAsync({ layout: 'auto', compute: { module, entryPoint: 'main' } });
  const size = PROBE_WORDS * 4;
  const out = device.createBuffer({ size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
  const read = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  const entries = [{ binding: 0, resource: { buffer: out } }];
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries }));
  pass.dispatchWorkgroups(1);
  pass.end();
  encoder.copyBufferToBuffer(out, 0, read, 0, size);
  device.queue.submit([encoder.finish()]);
  await injectFault(DEVICE_FAULTS[fault]);
  await read.mapAsync(GPUMapMode.READ);
  const words = new Uint32Array(read.getMappedRange().slice(0));
  device.destroy();
  const wrong = words.findIndex((word, i) => word !== i * 3 + 1);
  if (wrong >= 0) throw new Error(`the WebGPU device wrote ${words[wrong]} at word ${wrong} of a trivial dispatch`);
  return performance.now() - started;
}

// Resolves with the adapter's info once its device answered; rejects with NoProgress past the deadline.
function proveDevice(ep, fault = null) {
  deviceProof ??= probeAdapter(ep).then(async ({ adapter, info }) => {
    const why = (s) => `WebGPU adapter '${adapterLabel(info)}' made no progress on a trivial dispatch in ${s} s`;
    deviceProbe.dispatch_ms = await withDeadline(dispatch(adapter, fault), ep, why);
    return info;
  });
  return deviceProof;
}

// The two steps as Python asks for them: never rejected, what failed is in the answer.
async function probeStep(step) {
  try {
    await step();
    return { ok: true, device_probe: deviceProbe };
  } catch (e) {
    return { ok: false, no_progress: e instanceof NoProgress, error: errorText(e), device_probe: deviceProbe };
  }
}

// What decides what can run on the adapter: its own description, every feature, the size limits.
export async function adapterReport() {
  try {
    const { adapter, info } = await probeAdapter();
    const limits = { maxBufferSize: adapter.limits.maxBufferSize };
    limits.maxStorageBufferBindingSize = adapter.limits.maxStorageBufferBindingSize;
    return { available: true, info, features: [...adapter.features].sort(), limits };
  } catch (e) {
    return { available: false, error: errorText(e) };
  }
}

async function createMLContext(deviceType) {
  if (!('ml' in navigator)) {
    throw new Unsupported(missing('navigator.ml', 'WebNN is not enabled in this browser'));
  }
  try {
    return await navigator.ml.createContext({ deviceType });
  } catch (e) {
    throw new Unsupported(`navigator.ml.createContext({deviceType: '${deviceType}'}) failed: ${errorText(e)}`);
  }
}

// The EP option for the one EP the job asks for. WebGPU and WebNN are probed first so a missing
// adapter or context is reported as 'unsupported' with the browser's own words.
async function executionProvider(job) {
  const setup = EPS[job.ep]?.setup;
  if (setup === 'wasm') return { option: job.ep, facts: {} };
  if (setup === 'webgpu-adapter') {
    await proveDevice(job.ep, job.fault);
    return { option: job.ep, facts: {} };
  }
  if (setup === 'webnn-context') {
    // Passing our own MLContext makes ORT use exactly this device type, with no silent default.
    const context = await createMLContext(job.device_type);
    return { option: { name: job.ep, deviceType: job.device_type, context }, facts: {} };
  }
  throw new Error(`unknown execution provider '${job.ep}' (not in eps.json)`);
}

async function startRuntime(job) {
  if (runtime) {
    if (runtime.ep !== job.ep || runtime.threads !== job.threads) {
      throw new Error(`this page runs ${runtime.ep} with ${runtime.threads} threads; open a fresh page`);
    }
    return runtime;
  }
  if (!ort) {
    ort = await import(ORT_BASE + EPS[job.ep].bundle);
    ort.env.wasm.wasmPaths = ORT_BASE; // served locally, never a CDN
    // The binary this bundle runs, fetched here (in ranges when routed) and handed to ORT.
    ort.env.wasm.wasmBinary = await fetchBytes(ORT_BASE + EPS[job.ep].wasm_binary);
    ort.env.wasm.numThreads = job.threads;
    ort.env.wasm.proxy = false; // a proxy worker would put a postMessage hop inside every timed run
  }
  const ep = await executionProvider(job);
  const started = performance.now();
  const init = await ort.InferenceSession.create(fromBase64(INIT_MODEL_B64), { executionProviders: [ep.option] });
  const init_ms = performance.now() - started;
  await init.release();
  checkWasmBinary(job);
  runtime = { ep: job.ep, threads: job.threads, option: ep.option, init_ms, facts: ep.facts };
  return runtime;
}

// The glue code ORT loaded must belong to the binary the table gave it (X.mjs runs X.wasm).
function checkWasmBinary(job) {
  const binary = EPS[job.ep].wasm_binary;
  const glue = wasmFiles().filter((n) => n.endsWith('.mjs'));
  if (glue.length && !glue.includes(binary.replace(/\.wasm$/, '.mjs'))) {
    throw new Error(`ORT loaded ${glue.join(', ')} but eps.json gives ${job.ep} the binary ${binary}`);
  }
}

function wasmFiles() {
  const loaded = performance.getEntriesByType('resource').map((e) => e.name.split('/').pop());
  return loaded.filter((n) => /^ort-wasm.*\.(wasm|mjs)$/.test(n));
}

// Which EP each node went to. ORT-web, like native ORT, silently places nodes its EP cannot run on
// the wasm CPU EP; a throwaway session with ORT's verbose log prints the placement.
async function nodePlacement(bytes, options) {
  const start = logs.length;
  const probe = await ort.InferenceSession.create(bytes, { ...options, logSeverityLevel: 0, logVerbosityLevel: 0 });
  await probe.release();
  const placement = {};
  for (const line of logs.slice(start)) {
    const all = line.match(/All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)/);
    const some = line.match(/Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)/);
    const found = all ?? some;
    if (found) placement[found[1]] = (placement[found[1]] ?? 0) + Number(found[2]);
  }
  logs.length = start; // the verbose lines are not worth keeping
  return { node_placement: placement, placement_method: 'ORT verbose log of a throwaway session' };
}

// The options every session on the job's model is created with: its EP and, for a model whose weights
// live in external data files, one externalData entry per file: `path` is the location the .onnx names,
// `data` the file's URL. ORT-web fetches a URL itself and streams a file over 1 GB into memory it sizes
// from Content-Length, so no file is ever one ArrayBuffer here; the .onnx itself is the graph only.
// job.session_options: a generate job on WebGPU keeps present.* on the GPU (preferredOutputLocation).
function sessionOptions(job, rt) {
  const options = { executionProviders: [rt.option], ...job.session_options };
  if (job.external_data?.length) options.externalData = job.external_data.map((e) => ({ path: e.path, data: e.url }));
  return options;
}

// Shared by every page that loads a model file (a benchmark job, generation): one session per model URL.
async function getSession(job, rt) {
  const cached = sessions.get(job.model_url);
  if (cached) return cached;
  let started = performance.now();
  const bytes = await fetchBytes(job.model_url);
  const fetch_ms = performance.now() - started; // the graph file; external data is fetched inside create()
  const options = sessionOptions(job, rt);
  const placement = EPS[job.ep].node_placement ? await nodePlacement(bytes, options) : null;
  started = performance.now();
  const session = await ort.InferenceSession.create(bytes, options);
  // Later jobs on this page reuse the session: their load_ms is this one, and they say whose it is.
  const entry = { session, load_ms: performance.now() - started, fetch_ms, placement, load_case: job.case, options };
  if (job.profile_iterations > 0) entry.bytes = bytes; // for the profiled twin session
  sessions.set(job.model_url, entry);
  return entry;
}

async function makeFeeds(job) {
  const feeds = {};
  for (const input of job.inputs) {
    const Typed = TYPED_ARRAYS[input.dtype];
    if (!Typed) throw new Error(`input ${input.name}: unsupported dtype ${input.dtype}`);
    const bytes = await fetchBytes(input.url);
    feeds[input.name] = new ort.Tensor(input.dtype, new Typed(bytes.buffer), input.dims);
  }
  return feeds;
}

function encodeTensor(name, tensor) {
  const data = tensor.data;
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  return { name, dtype: tensor.type, dims: Array.from(tensor.dims), data_b64: toBase64(bytes) };
}

async function injectFault(fault) {
  // Test-only (tests/test_web.py): never set by the CLI. Exercises the harness's recovery paths.
  if (fault === 'throw') throw new Error('fault injected by the test suite: the page threw');
  if (fault === 'hang') for (;;); // blocks the page's main thread for good
  // Never settles, the page stays responsive: a stalled job, or one the driver kills the browser under.
  if (fault === 'stall' || fault === 'kill') await new Promise(() => {});
  if (fault === 'frozen_timer') {
    // A clock that never advances, for the rest of this page's life (a fresh page per setting).
    const frozen = performance.now();
    performance.now = () => frozen;
  }
}

// first run (timed) -> warmup -> timed iterations: stop.mjs, the same stop rule as harness/run/measure.py (Budget).
// The case's time budget (job.max_time_ms, null for none) starts with the first run and caps the warmup
// and the timed loop. The loop runs until both the count and the duration are met, capped by
// max_iterations, and stops early once the budget is spent, but never before min_iterations samples.
// session.run returns CPU tensors (preferredOutputLocation defaults to 'cpu'), so the device->CPU
// download is inside the timing. `run` is one call (our own: session.run; another runtime's: its module's call),
// `encode` makes the first call's result the answer's outputs; `floorMs`: the least time the first run and warm-up
// last, besides the count (another runtime's: job.runtime_min_warmup_ms, its own wasm tiering up), within the budget.
async function measure(run, job, encode, floorMs = 0) {
  let t0 = performance.now();
  const started = t0;
  const deadline = job.max_time_ms == null ? Infinity : t0 + job.max_time_ms;
  const first = await run();
  const first_run_ms = performance.now() - t0;
  const outputs = encode(first);
  let warmup_run = 0;
  const warming = () => warmup_run < job.warmup || performance.now() - started < floorMs;
  while (warming() && performance.now() < deadline) {
    await run();
    warmup_run++;
  }
  const warmup_ms = performance.now() - started;
  const warmupCut = warming(); // the budget ended it
  const samples = [];
  await loopMark('start');
  const stop = loopStop(job, deadline);
  let loop_stopped = false;
  for (;;) {
    const why = stop(samples.length);
    if (why !== null) {
      loop_stopped = why === 'budget';
      break;
    }
    t0 = performance.now();
    await run();
    samples.push(performance.now() - t0);
  }
  await loopMark('end');
  const budget = {
    max_time_s: job.max_time_ms == null ? null : job.max_time_ms / 1000,
    warmup_run,
    budget_stopped: loop_stopped || warmupCut,
    ...(floorMs > 0 && { min_warmup_ms: floorMs, warmup_ms }),
  };
  return { first_run_ms, samples, outputs, budget };
}

// Per-node times, after the timed loop, from a twin session with ORT's profiler on (profiling is a session
// option: the timed session never has it). ORT-web prints the trace (Chrome trace JSON, one event per
// line) to the console at endProfiling(); Python parses it with native ORT's parser. The first run
// allocates and is left out there. On WebGPU the trace holds the kernels' GPU times only when ORT's device
// has timestamp-query; without it the profile says why it has none.
async function profileRuns(entry, feeds, job) {
  const missing = await missingTimestamps(job);
  if (missing) return { error: missing };
  const session = await ort.InferenceSession.create(entry.bytes, { ...entry.options, enableProfiling: true });
  try {
    await session.run(feeds);
    const started = performance.now();
    for (let i = 0; i < job.profile_iterations; i++) await session.run(feeds);
    const wall_ms = performance.now() - started;
    traceLines = [];
    try {
      await session.endProfiling();
      await new Promise((resolve) => setTimeout(resolve, 0)); // endProfiling prints from a settled promise
      return { events: traceEvents(traceLines), skip_runs: 1, iterations: job.profile_iterations, wall_ms };
    } finally {
      traceLines = null;
    }
  } finally {
    await session.release();
  }
}

// A profile that fails costs the row its profile, never its measurement.
function profileError(e) {
  traceLines = null;
  return { error: `profiling failed: ${errorText(e)}` };
}

async function missingTimestamps(job) {
  if (EPS[job.ep].setup !== 'webgpu-adapter') return null;
  const device = await ort.env.webgpu.device;
  if (device?.features.has('timestamp-query')) return null;
  const adapter = (await navigator.gpu.requestAdapter())?.features.has('timestamp-query') ? 'has' : 'lacks';
  return (
    `ORT's WebGPU device has no timestamp-query feature (the adapter ${adapter} it), so ORT-web cannot time ` +
    `its kernels; Chromium exposes it with --enable-dawn-features=allow_unsafe_apis on adapters that support it`
  );
}

// The trace's events the parser reads, with only the arguments it reads (the full trace of a base model
// is megabytes of per-node memory statistics).
function traceEvents(lines) {
  const start = lines.indexOf('[');
  const end = lines.lastIndexOf(']');
  if (start < 0 || end < start) throw new Error(`ORT printed no profile (${lines.length} console lines)`);
  const events = JSON.parse(lines.slice(start, end + 1).join('\n').replace(/,\s*\]$/, ']'));
  return events
    .filter((e) => e.cat === 'Node' || e.cat === 'Api' || e.name === 'model_run')
    .map(({ cat, name, ts, dur, args }) => ({
      cat,
      name,
      ts,
      dur,
      args: { op_name: args?.op_name, provider: args?.provider },
    }));
}

// A browser the harness launched samples its processes' memory between these marks (a Playwright
// binding, awaited outside the timed region); a remote browser has no binding.
async function loopMark(mark) {
  if (typeof window.accelharnessLoopMark === 'function') await window.accelharnessLoopMark(mark);
}

// The page's own memory as the browser measures it (JS heaps, DOM, shared; cross-origin isolated
// pages only). A launched browser answers at once (ForceEagerMeasureMemory); others may wait for
// their next GC, so this gives up after PAGE_MEMORY_TIMEOUT_MS.
async function pageMemory() {
  if (!self.crossOriginIsolated || !performance.measureUserAgentSpecificMemory) {
    return { error: 'performance.measureUserAgentSpecificMemory needs a cross-origin isolated page' };
  }
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve(null), PAGE_MEMORY_TIMEOUT_MS);
  });
  try {
    const measured = await Promise.race([performance.measureUserAgentSpecificMemory(), late]);
    if (!measured) return { error: `no answer within ${PAGE_MEMORY_TIMEOUT_MS} ms (the browser waits for a GC)` };
    const by_type = {};
    for (const part of measured.breakdown) {
      const kind = part.types.join('+') || 'unattributed';
      by_type[kind] = (by_type[kind] ?? 0) + part.bytes;
    }
    return { bytes: measured.bytes, by_type };
  } catch (e) {
    return { error: errorText(e) };
  } finally {
    clearTimeout(timer);
  }
}

async function runtimeFacts(job, rt) {
  const facts = {
    ort_web_version: ort?.env.versions.web ?? null,
    ort_common_version: ort?.env.versions.common ?? null,
    bundle: EPS[job.ep]?.bundle ?? null,
    threads_requested: job.threads,
    ep_check: EPS[job.ep]?.check ?? null,
  };
  if (!ort || !rt) return facts;
  // ORT resets env.wasm.numThreads to 1 when it cannot start threads (no SharedArrayBuffer).
  facts.threads_effective = ort.env.wasm.numThreads;
  facts.threads_dropped = job.threads > 1 && ort.env.wasm.numThreads < job.threads;
  facts.wasm_files = wasmFiles();
  facts.wasm_binary = EPS[job.ep].wasm_binary;
  facts.runtime_init_ms = rt.init_ms;
  Object.assign(facts, rt.facts);
  if (job.ep === 'webgpu') {
    // The device ORT actually runs on (its adapterInfo), not just the adapter we probed.
    const device = await ort.env.webgpu.device;
    facts.adapter = adapterInfo(device?.adapterInfo);
    facts.device_features = device ? [...device.features].sort() : null; // shader-f16 here: ORT enabled fp16
  }
  return facts;
}

function consoleWarnings() {
  return logs.filter((l) => l.startsWith('[warn]') || l.startsWith('[error]')).slice(-20);
}

export async function runJob(job) {
  if (job.runtime && job.runtime !== OWN_RUNTIME) return runtimeJob(job);
  const facts = await environmentFacts();
  if (EPS[job.ep]?.device_probe_s) facts.device_probe = deviceProbe;
  let rt = null;
  try {
    rt = await startRuntime(job);
    const entry = await getSession(job, rt);
    const feeds = await makeFeeds(job);
    if (job.mode === 'generate') return await generateJob(job, rt, entry, feeds, facts);
    await injectFault(job.fault);
    const encode = (first) => entry.session.outputNames.map((name) => encodeTensor(name, first[name]));
    const measured = await measure(() => entry.session.run(feeds), job, encode);
    const asked = job.profile_iterations > 0;
    const profile = asked ? await profileRuns(entry, feeds, job).catch(profileError) : null;
    Object.assign(facts, await runtimeFacts(job, rt), measured.budget, {
      fetch_ms: entry.fetch_ms,
      input_names: entry.session.inputNames,
      output_names: entry.session.outputNames,
      load_measured_with: entry.load_case,
    });
    if (entry.placement) Object.assign(facts, entry.placement);
    if (job.fault === 'bad_facts') facts.node_placement = { CPUExecutionProvider: 'many' }; // test-only
    facts.page_memory = await pageMemory();
    facts.console_warnings = consoleWarnings();
    return {
      status: 'ok',
      samples_ms: measured.samples,
      first_run_ms: measured.first_run_ms,
      load_ms: entry.load_ms,
      outputs: measured.outputs,
      ...(profile && { profile }),
      facts,
    };
  } catch (e) {
    Object.assign(facts, await runtimeFacts(job, rt).catch(() => ({})));
    facts.console_warnings = consoleWarnings();
    return { status: e instanceof Unsupported ? 'unsupported' : 'error', error: errorText(e), facts };
  }
}

// A generate job (web/page/generate.mjs): the fault hook fires mid-generation, in the first timed one.
async function generateJob(job, rt, entry, feeds, facts) {
  const hooks = { fault: () => injectFault(job.fault), memory: pageMemory, loopMark };
  const once = job.seq2seq ? seq2seqOnce(ort, await seq2seqSessions(job, rt, entry), feeds, job) : null;
  const measured = await measureGeneration(ort, entry.session, feeds, job, hooks, once);
  if (job.passage) { // the perplexity passage, untimed after the timed loop; its failure is the row's missing figure
    const started = performance.now();
    measured.generation.passage = await passageScores(ort, entry.session, job, fetchBytes)
      .then((scores) => ({ ...scores, ms: performance.now() - started }))
      .catch((e) => ({ error: errorText(e).slice(0, 500) }));
  }
  Object.assign(facts, await runtimeFacts(job, rt), measured.budget, {
    fetch_ms: entry.fetch_ms,
    input_names: entry.session.inputNames,
    output_names: entry.session.outputNames,
    load_measured_with: entry.load_case,
    output_locations: job.session_options?.preferredOutputLocation ?? 'cpu',
  });
  if (entry.placement) Object.assign(facts, entry.placement);
  facts.page_memory = measured.generation.memory_after;
  facts.console_warnings = consoleWarnings();
  const { samples: samples_ms, first_run_ms, generation } = measured;
  return { status: 'ok', samples_ms, first_run_ms, load_ms: entry.load_ms, generation, facts };
}

// An encoder-decoder's other graphs (job.seq2seq): the encoder and the later steps' decoder (a merged decoder's
// is the job's own session), each one session per URL like the job's model, with its own output locations.
async function seq2seqSessions(job, rt, entry) {
  const { encoder_url, decoder_past_url, decoder_past_options } = job.seq2seq;
  const other = (url, options) => getSession({ ...job, model_url: url, external_data: [], session_options: options }, rt);
  const encoder = (await other(encoder_url, undefined)).session;
  const decoderPast = decoder_past_url ? (await other(decoder_past_url, decoder_past_options)).session : entry.session;
  return { encoder, decoder: entry.session, decoderPast };
}

// A job's inputs as raw typed arrays ({name: {dtype, dims, data}}), for a runtime that is not ORT's own loop: the
// prompt's ids (int64, [batch, length]) and mask, handed to the runtime directly (no tokenizer runs in the page).
async function rawInputs(job) {
  const inputs = {};
  for (const input of job.inputs) {
    const Typed = TYPED_ARRAYS[input.dtype];
    if (!Typed) throw new Error(`input ${input.name}: unsupported dtype ${input.dtype}`);
    const data = new Typed((await fetchBytes(input.url)).buffer);
    inputs[input.name] = { dtype: input.dtype, dims: input.dims, data };
  }
  if (inputs.audio) return inputs; // speech: its samples (and the features native ORT ran, to compare)
  if (inputs.input_ids?.dtype !== 'int64') throw new Error('a page runtime reads an int64 input_ids');
  return inputs;
}

// What the page gives a runtime module (web/page/runtimes/*.mjs): its fetch (byte ranges when routed), the error
// a runtime that cannot run raises ('unsupported'), and where its npm files are served (web/runtime_dist.py).
const PAGE_TOOLS = {
  fetchBytes,
  Unsupported,
  errorText,
  filesOf: (name) => new URL(`../runtimes/${encodeURIComponent(name)}/`, import.meta.url).href,
  encodeTensor,
};
const runtimeModules = new Map(); // module file -> its module (its runtime, once loaded, lives as long as the page)

// A generate job on another page runtime: its module loads the model (load_ms) and runs one greedy generation per
// call (load() returns {load_ms, once}; once(hook, keepLogits) -> {total_ms, ttft_ms, steps, tokens, prefill_logits,
// step_top}; facts(job): what ran, read back from the runtime, also after a failure); generate.mjs's
// measureGeneration runs the warm-up, the stop rule and the memory readings around it, as for ORT's own loop.
// The answer has generateJob's shape; facts.runtime says what ran (name, version, backend, threads read back).
// What every runtime's facts say, from the job and the table; the module adds what it read back (its version, the
// threads it runs: null where it could not tell) and its own facts.
const sharedFacts = (job, row) => ({ name: job.runtime, version: null, backend: job.ep, threads_requested: job.threads,
  threads_effective: null, model_format: row?.format ?? null });

async function otherRuntimeFacts(job, row, module) {
  return { ...sharedFacts(job, row), ...(module ? await module.facts(job) : {}) };
}

async function runtimeJob(job) {
  const facts = await environmentFacts();
  const row = RUNTIMES[job.runtime];
  let module = null;
  try {
    if (!row?.module) throw new Error(`unknown page runtime '${job.runtime}' (not in runtimes.json)`);
    if (!runtimeModules.has(row.module)) runtimeModules.set(row.module, await import(`./runtimes/${row.module}`));
    module = runtimeModules.get(row.module);
    const refused = module.refuse?.(job); // a runtime that cannot run here at all says why first
    if (refused) throw new Unsupported(refused);
    const runs = job.mode === 'generate' || Boolean(module.infer); // inference: a module that answers one call
    if (!runs || !row.modes.includes(job.mode)) {
      throw new Unsupported(`${job.runtime} runs ${row.modes.join(', ')} in the page, not ${job.mode}`);
    }
    if (!row.backends.includes(job.ep)) {
      throw new Unsupported(`${job.runtime} runs on ${row.backends.join(', ')}, not ${job.ep}`);
    }
    if (job.mode === 'inference') return await runtimeInference(job, row, module, facts);
    if (job.depth > 0 && !module.depths) { // a module that fills its cache to a depth says so (wllama.mjs)
      throw new Unsupported(`${job.runtime}: its page module does not fill a KV cache to a depth`);
    }
    const inputs = await rawInputs(job);
    const loaded = await module.load(job, inputs, row, PAGE_TOOLS);
    const hooks = { fault: () => injectFault(job.fault), memory: pageMemory, loopMark };
    const measured = await measureGeneration(null, null, inputs, job, hooks, loaded.once);
    const runtime = await otherRuntimeFacts(job, row, module);
    Object.assign(facts, measured.budget, { runtime, runtime_check: row.check });
    facts.page_memory = measured.generation.memory_after;
    facts.console_warnings = consoleWarnings();
    const { samples: samples_ms, first_run_ms, generation } = measured;
    return { status: 'ok', samples_ms, first_run_ms, load_ms: loaded.load_ms, generation, facts };
  } catch (e) {
    facts.runtime = await otherRuntimeFacts(job, row, module).catch(() => sharedFacts(job, row));
    facts.runtime_check = row?.check ?? null;
    facts.console_warnings = consoleWarnings();
    return { status: e instanceof Unsupported ? 'unsupported' : 'error', error: errorText(e), facts };
  }
}

// An inference job on another page runtime: its module loads the model and makes one call as an app does
// (infer(job, inputs, row, tools) -> {load_ms, run, encode}); measure() times run() as it times our own session.run
// (the same stop rule), after the fault hook; the answer has runJob's inference shape (outputs, not a generation).
async function runtimeInference(job, row, module, facts) {
  const inputs = await rawInputs(job);
  const loaded = await module.infer(job, inputs, row, PAGE_TOOLS);
  await injectFault(job.fault);
  const measured = await measure(loaded.run, job, loaded.encode, job.runtime_min_warmup_ms ?? 0);
  const runtime = await otherRuntimeFacts(job, row, module);
  Object.assign(facts, measured.budget, { runtime, runtime_check: row.check });
  facts.page_memory = await pageMemory();
  facts.console_warnings = consoleWarnings();
  const { samples: samples_ms, first_run_ms, outputs } = measured;
  return { status: 'ok', samples_ms, first_run_ms, load_ms: loaded.load_ms, outputs, facts };
}

// Whether a WebNN context of this device type can be made here (and the browser's words if not).
export async function webnnReport(deviceType) {
  try {
    await createMLContext(deviceType);
    return { available: true, device_type: deviceType };
  } catch (e) {
    return { available: false, device_type: deviceType, error: errorText(e) };
  }
}

// What `accelharness hardware` reports for the browser platforms: no ORT, just the browser's APIs.
export async function probe(deviceType) {
  const facts = await environmentFacts();
  facts.webgpu = await adapterReport();
  facts.webnn = await webnnReport(deviceType);
  return facts;
}

window.accelharness = {
  runJob,
  probe,
  adapterReport,
  probeAdapter: (ep) => probeStep(() => probeAdapter(ep)),
  proveDevice: (ep, fault) => probeStep(() => proveDevice(ep, fault)),
};
window.accelharnessReady = true;
