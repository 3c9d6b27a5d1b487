// WebLLM (@mlc-ai/web-llm: MLC/TVM) in the page, on the model folder the user supplies (--webllm-model DIR: its
// TVM-compiled model library and MLC weights, checked as data by harness/prepare/mlc_folder.py), served under
// job.runtime_model_base: the weights in mlc/, the library beside it (job.model_url). WebLLM appends resolve/main/ to
// a model URL without a /resolve/…/ part (a hub's layout); the page's server serves one folder level, so the model
// URL carries that part in its query ("mlc/?/resolve/main/"), which every file's URL, resolved against it, drops.
// Its own ES module and package.json are served locally (web/runtime_dist.py); nothing is fetched from a CDN or hub.
// What runs: WebGPU's adapter looked at, then CreateMLCEngine on the served files (its load timed: the library
// instantiated, the weights fetched to the GPU). Its generation is not run: WebLLM takes text and returns text (its
// log-probabilities are of text pieces, not ids), so its tokens cannot be held to the prompt ids and the reference
// tokens every row is checked against; after a load the job is `unsupported` saying so, with the load's time. A load
// that fails is an `error` with WebLLM's words. No real model library was at hand where this was written, so the
// load has only been seen failing (a library that is no wasm).

const MODEL_ID = 'accelharness-webllm';
const SERVED_BASE = 'mlc/'; // harness/prepare/mlc_folder.py's SERVED_BASE
const HUB_PART = '?/resolve/main/'; // read by WebLLM 0.2.86's cleanModelUrl, dropped by new URL(file, model)
const FACTS = {};
let engine = null;

// Why this runtime cannot run the job (the page asks before anything else): a job without its folder.
export function refuse(job) {
  if (job.runtime_model_base && job.model_url) return null;
  return 'WebLLM needs its TVM-compiled model library (.wasm) and MLC weights (mlc-chat-config.json, params shards); ' +
    'none is given (--webllm-model DIR)';
}

async function adapterFacts(tools) {
  if (!navigator.gpu) throw new tools.Unsupported('WebLLM runs on WebGPU, which this browser does not offer');
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new tools.Unsupported('WebLLM runs on WebGPU; this browser gave no WebGPU adapter');
  const info = adapter.info ?? {};
  return { vendor: info.vendor ?? null, architecture: info.architecture ?? null, description: info.description ?? null,
    shader_f16: adapter.features.has('shader-f16') };
}

export async function load(job, inputs, row, tools) {
  const files = tools.filesOf('webllm');
  FACTS.version = (await (await fetch(files + 'package.json')).json()).version;
  FACTS.adapter = await adapterFacts(tools);
  const webllm = await import(files + 'web-llm.js');
  const model = new URL(SERVED_BASE, new URL(job.runtime_model_base, location.href)).href + HUB_PART;
  const appConfig = { model_list: [{ model, model_id: MODEL_ID, model_lib: new URL(job.model_url, location.href).href }] };
  const started = performance.now();
  await engine?.unload();
  engine = await webllm.CreateMLCEngine(MODEL_ID, { appConfig, logLevel: 'WARN' });
  FACTS.load_ms = performance.now() - started;
  throw new tools.Unsupported(
    `WebLLM loaded the folder's model in ${FACTS.load_ms.toFixed(0)} ms; its generation is not run here: its API ` +
      'takes and returns text, so its tokens cannot be checked against the prompt ids and the reference tokens');
}

export async function facts() {
  return { ...FACTS, threads_effective: null }; // WebGPU: no thread count to read back
}
