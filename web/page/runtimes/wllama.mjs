// llama.cpp in the page through wllama (@wllama/wllama 3.x: llama-server's server-context compiled to wasm, run in a
// worker). 3.x has no low-level decode/logits calls and its completion takes its prompt as text only (a token array
// is refused: "type must be string"), so the job's prompt ids are turned into text with the GGUF's own vocabulary
// (read here from the file's header) and llama.cpp tokenizes it again; its count of prompt tokens must equal the
// job's (else an error says so: ids drawn at random need not survive the round trip). A generation is one raw
// completion request: greedy (top_k 1, temperature 0), EOS ignored unless the job stops at EOS, the prompt cache off
// (every generation prefills its prompt again: the KV cache is not reused between generations). It streams a chunk
// per token; a decode step's clock stops when its chunk reaches the page (the token chosen and handed to app code,
// the worker's postMessage included). wllama reads a result after its next loop iteration, so a chunk reaches the
// page one decode step after its token was chosen (measured: chunk k arrives when token k+1 is made; the last two
// together). So each generation asks for one token more than the job's and keeps the job's count: the arrivals of
// tokens 0..N-1 are the moments tokens 1..N were made, and their N-1 differences are N-1 whole decode steps of the
// same loop (tokens 2..N's). TTFT is llama.cpp's own prompt time of the same generation (timings.prompt_ms: from
// the prompt's processing to the first token sampled, its clock inside the worker), since the page sees the first
// token only a step later. Each chunk carries its token's id in its logprobs (n_probs 1 in timed generations); the
// warm-up asks for the top job.top_k candidates, whose values are llama.cpp's log-probabilities (log-softmax of the
// step's logits before sampling), not logits. Threads: n_threads given; the count the worker started llama.cpp with
// is read back from its own report, not assumed.
// WebGPU: wllama 3.8.1's wasm carries llama.cpp's ggml-webgpu backend; a webgpu job loads with every layer offloaded
// asked (n_gpu_layers 99999), a wasm job with none (wllama then hides navigator.gpu from its worker). What ran is read
// back from llama.cpp's own load log (its "offloaded N/M layers to GPU" line and the buffers holding the weights):
// ggml-webgpu registers no device on an adapter without shader-f16, and llama.cpp then runs every layer on the CPU
// without an error, so a webgpu job with no layer offloaded is `unsupported`, saying so, never a webgpu row.

const FACTS = {}; // what the last load found, for facts()
let state = null; // {wllama, meta, n_ctx, key, load_ms}: the model loaded last

function logger(lines) {
  const keep = (level) => (...args) => {
    const text = args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a))).join(' ');
    if (lines.length < 2000) lines.push(text);
    if (level === 'warn' || level === 'error') console[level](`[wllama] ${text}`);
  };
  return { debug: keep('debug'), log: keep('log'), info: keep('info'), warn: keep('warn'), error: keep('error') };
}

// The threads wllama's worker started llama.cpp with, from its own report ("Multithread enabled: true,
// pthreadPoolSize: 4"; a single-thread start has a pool of 0): read back, not the count asked for.
function threadsFromLog(lines) {
  for (const line of lines) {
    const found = line.match(/Multithread enabled: (true|false), pthreadPoolSize: (\d+)/);
    if (found) return found[1] === 'true' ? Number(found[2]) : 1;
  }
  return null;
}

// What llama.cpp's load log says it placed where: the layers offloaded to a GPU device (null where it printed no
// offload line: none was, as on a CPU-only load) and the buffer types holding the model's weights ("CPU", "WebGPU").
export function offloadFromLog(lines) {
  const offload = { layers_offloaded: null, layers_total: null, weight_buffers: [] };
  for (const line of lines) {
    const layers = line.match(/offloaded (\d+)\/(\d+) layers to GPU/);
    if (layers) [offload.layers_offloaded, offload.layers_total] = [Number(layers[1]), Number(layers[2])];
    const buffer = line.match(/load_tensors:\s+(\S+) model buffer size/);
    if (buffer && !offload.weight_buffers.includes(buffer[1])) offload.weight_buffers.push(buffer[1]);
  }
  return offload;
}

// The page's WebGPU adapter, as WebLLM's row states it (a software one, SwiftShader here, says so in its own words).
async function adapterFacts(tools) {
  if (!navigator.gpu) throw new tools.Unsupported('llama.cpp (wllama) on webgpu: this browser offers no WebGPU');
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new tools.Unsupported('llama.cpp (wllama) on webgpu: this browser gave no WebGPU adapter');
  const info = adapter.info ?? {};
  return { vendor: info.vendor ?? null, architecture: info.architecture ?? null, description: info.description ?? null,
    shader_f16: adapter.features.has('shader-f16') };
}

// A webgpu job whose load offloaded no layer ran on the CPU: unsupported, with what llama.cpp's log and the adapter say.
function checkOffload(job, offload, adapter, tools) {
  if (job.ep !== 'webgpu' || offload.layers_offloaded > 0) return;
  const where = offload.weight_buffers.join(', ') || 'no buffer reported';
  const f16 = adapter.shader_f16 ? '' : ' (the adapter has no shader-f16, which ggml-webgpu requires)';
  const name = [adapter.vendor, adapter.architecture, adapter.description].filter(Boolean).join(' ') || 'unnamed';
  throw new tools.Unsupported(`llama.cpp (wllama ${FACTS.version}) on webgpu offloaded no layer to the GPU on this ` +
    `adapter (${name})${f16}: its load log names no offload and the weights were in ${where} buffers, so it runs ` +
    'on the CPU: not a webgpu row');
}

// GGUF metadata values by type id (gguf.py's GGUFValueType), read little-endian from the file's header.
const GGUF_SCALARS = {
  0: ['getUint8', 1], 1: ['getInt8', 1], 2: ['getUint16', 2], 3: ['getInt16', 2], 4: ['getUint32', 4],
  5: ['getInt32', 4], 6: ['getFloat32', 4], 7: ['getUint8', 1], 10: ['getBigUint64', 8], 11: ['getBigInt64', 8],
  12: ['getFloat64', 8],
};

// The GGUF header's key/value metadata (the tokenizer's tokens and types included, which wllama does not return).
export function ggufMetadata(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const text = new TextDecoder();
  let at = 0;
  const u32 = () => ((at += 4), view.getUint32(at - 4, true));
  const u64 = () => ((at += 8), Number(view.getBigUint64(at - 8, true)));
  const str = () => {
    const n = u64();
    at += n;
    return text.decode(bytes.subarray(at - n, at));
  };
  const value = (type) => {
    if (type === 8) return str();
    if (type === 9) {
      const [itemType, n] = [u32(), u64()];
      return Array.from({ length: n }, () => value(itemType));
    }
    const [getter, size] = GGUF_SCALARS[type] ?? [];
    if (!getter) throw new Error(`GGUF metadata type ${type} unknown`);
    at += size;
    const v = view[getter](at - size, true);
    return typeof v === 'bigint' ? Number(v) : type === 7 ? v !== 0 : v;
  };
  if (text.decode(bytes.subarray(0, 4)) !== 'GGUF') throw new Error('the model file is not a GGUF');
  at = 8;
  u64(); // tensors
  const meta = {};
  for (let kv = u64(); kv > 0; kv--) {
    const key = str();
    meta[key] = value(u32());
  }
  return meta;
}

// GPT-2's byte-level alphabet: the character each byte is spelled with in a 'gpt2' (BPE) vocabulary.
function byteOfChar() {
  const bytes = [];
  for (let b = 33; b <= 126; b++) bytes.push(b);
  for (let b = 161; b <= 172; b++) bytes.push(b);
  for (let b = 174; b <= 255; b++) bytes.push(b);
  const chars = bytes.map((b) => b);
  for (let b = 0, n = 0; b < 256; b++) {
    if (!bytes.includes(b)) {
      bytes.push(b);
      chars.push(256 + n++);
    }
  }
  return new Map(chars.map((c, i) => [String.fromCodePoint(c), bytes[i]]));
}

// The job's prompt ids as the text llama.cpp is to tokenize back into them: each token's bytes by the GGUF's
// vocabulary ('llama': SentencePiece, '▁' a space, <0xNN> byte tokens; 'gpt2': byte-level BPE); a leading BOS left
// to llama.cpp (it adds one where the GGUF says so), SentencePiece's added leading space taken off.
export function promptText(ids, meta) {
  const model = meta['tokenizer.ggml.model'];
  const tokens = meta['tokenizer.ggml.tokens'];
  const types = meta['tokenizer.ggml.token_type'] ?? [];
  if (!tokens || !['llama', 'gpt2'].includes(model)) {
    throw new Error(`the GGUF's tokenizer '${model}' is not one the page can spell a prompt in (llama, gpt2)`);
  }
  const bos = meta['tokenizer.ggml.bos_token_id'];
  const addBos = meta['tokenizer.ggml.add_bos_token'] ?? model === 'llama';
  const body = addBos && ids[0] === bos ? ids.slice(1) : ids;
  const bytes = [];
  const gpt2 = model === 'gpt2' ? byteOfChar() : null;
  const encoder = new TextEncoder();
  for (const id of body) {
    const piece = tokens[id];
    if (piece === undefined) throw new Error(`prompt id ${id} is outside the GGUF's ${tokens.length} tokens`);
    const byte = piece.match(/^<0x([0-9A-Fa-f]{2})>$/);
    if (model === 'llama' && types[id] === 6 && byte) bytes.push(parseInt(byte[1], 16));
    else if (gpt2 && types[id] !== 3 && types[id] !== 4) for (const c of piece) bytes.push(gpt2.get(c) ?? 0x3f);
    else bytes.push(...encoder.encode(model === 'llama' ? piece.replaceAll('\u2581', ' ') : piece));
  }
  let text = new TextDecoder().decode(Uint8Array.from(bytes));
  const spacePrefix = meta['tokenizer.ggml.add_space_prefix'] ?? model === 'llama';
  if (model === 'llama' && spacePrefix && text.startsWith(' ')) text = text.slice(1);
  // what llama.cpp should count: the ids, plus a BOS it adds in front of a prompt that lacks one
  return { text, expected: ids.length + (addBos && ids[0] !== bos ? 1 : 0), bos_added: addBos && ids[0] !== bos };
}

async function start(job, inputs, tools) {
  const base = tools.filesOf('llama.cpp');
  const lib = await import(base + 'wllama.js');
  const lines = [];
  const wllama = new lib.Wllama({ default: base + 'wllama.wasm' }, { logger: logger(lines), allowOffline: true });
  // the compat build served here too: a browser without memory64 or JSPI never fetches it from a CDN
  wllama.setCompat({ worker: base + 'compat-wllama.js', wasm: base + 'compat-wllama.wasm' });
  const adapter = job.ep === 'webgpu' ? await adapterFacts(tools) : null;
  const bytes = await tools.fetchBytes(job.model_url);
  const meta = ggufMetadata(bytes);
  const started = performance.now();
  await wllama.loadModel([new Blob([bytes])], {
    n_threads: job.threads,
    n_ctx: contextFor(inputs, job),
    n_batch: Math.max(inputs.input_ids.dims[1], 32),
    n_parallel: 1,
    n_gpu_layers: job.ep === 'webgpu' ? 99999 : 0,
    warmup: false,
  });
  const load_ms = performance.now() - started;
  const info = wllama.getModelMetadata();
  Object.assign(FACTS, {
    version: (await (await fetch(base + 'package.json')).json()).version, // the served package's own
    llama_cpp_build: lib.Wllama.getLibllamaVersion(),
    threads_effective: threadsFromLog(lines),
    multithread_build: wllama.isMultithread(),
    compat_build: wllama.getWorkerResources().compat,
    gguf_file_type: meta['general.file_type'] ?? null,
    gguf_architecture: meta['general.architecture'] ?? null,
    gguf_tokenizer: meta['tokenizer.ggml.model'] ?? null,
    n_vocab: info.hparams.nVocab,
    prompt_input: 'text spelled from the prompt ids with the GGUF vocabulary (wllama 3.x takes no token ids)',
    n_ctx: wllama.getLoadedContextInfo().n_ctx,
    webgpu: job.ep === 'webgpu',
    n_gpu_layers: job.ep === 'webgpu' ? 99999 : 0,
    offload: offloadFromLog(lines), // read back from llama.cpp's load log, not assumed
    adapter,
  });
  try {
    checkOffload(job, FACTS.offload, adapter ?? {}, tools);
  } catch (e) {
    await wllama.exit(); // its worker goes with the refusal
    throw e;
  }
  return { wllama, meta, load_ms, n_ctx: contextFor(inputs, job) };
}

// The context a job needs: its depth, prompt and new tokens, and a margin.
const contextFor = (inputs, job) => (job.depth ?? 0) + inputs.input_ids.dims[1] + job.new_tokens + 8;

// This module fills a KV cache to job.depth (runner.mjs asks before handing it a job at a depth).
export const depths = true;

// At a depth (--depths, llama-bench's -d) the cache holds job.depth tokens before the prompt, filled untimed, as
// generate.mjs's own loop fills it: the prompt's ids repeated to that length. wllama 3.x has no call that trims its
// KV cache, so llama-server's prompt cache does it: before each generation an untimed one-token completion of the
// filler alone (cache_prompt on) keeps the cache's common prefix, the filler, and drops what the last generation
// added; the generation then sends filler + prompt with the cache kept, and llama.cpp's own timings must say it
// reused exactly the filler (cache_n) and processed exactly the prompt (prompt_n), else the job is an error.
function depthPrompt(ids, job, meta) {
  const filler = Array.from({ length: job.depth }, (_, i) => ids[i % ids.length]);
  const fill = promptText(filler, meta);
  const full = promptText(filler.concat(ids), meta);
  if (!full.text.startsWith(fill.text)) throw new Error('the depth filler, spelled as text, is not the prompt\'s prefix');
  return { ...full, fill: fill.text, cached: fill.expected, fresh: full.expected - fill.expected };
}

async function refill(wllama, prompt) {
  await wllama.createCompletion({ prompt: prompt.fill, max_tokens: 1, temperature: 0, top_k: 1, cache_prompt: true,
    ignore_eos: true, stream: false });
}

// llama.cpp's count of the tokens it took from its cache and the tokens it processed: the filler and the prompt.
function checkDepth(prompt, timings) {
  if (prompt.fill === undefined) return;
  if (timings?.cache_n !== prompt.cached || timings?.prompt_n !== prompt.fresh) {
    throw new Error(`at depth llama.cpp was to reuse ${prompt.cached} cached tokens and process the prompt's ` +
      `${prompt.fresh}; its timings say cache_n ${timings?.cache_n}, prompt_n ${timings?.prompt_n}`);
  }
}

export async function load(job, inputs, row, tools) {
  if (inputs.input_ids.dims[0] !== 1) throw new tools.Unsupported('wllama generates one sequence here (batch 1)');
  const key = `${job.model_url} ${job.threads} ${job.ep}`;
  if (state?.key !== key || state.n_ctx < contextFor(inputs, job)) {
    await state?.wllama.exit();
    state = null;
    state = { ...(await start(job, inputs, tools)), key };
  }
  const { wllama, meta } = state;
  const ids = Array.from(inputs.input_ids.data, Number);
  const prompt = job.depth > 0 ? depthPrompt(ids, job, meta) : promptText(ids, meta);
  FACTS.prompt_bos_added = prompt.bos_added;
  FACTS.depth_fill = job.depth > 0 ? 'the prompt ids repeated to the depth, untimed; restored before each ' +
    "generation by a one-token completion of that filler alone (llama-server's prompt cache), cache_n checked" : null;
  return { load_ms: state.load_ms, once: (hook, keepLogits) => generateOnce(wllama, prompt, job, hook, keepLogits) };
}

async function generateOnce(wllama, prompt, job, hook, keepLogits) {
  if (hook) {
    await hook(0);
    await hook(1); // the fault hook fires before the generation (a request cannot be paused mid-stream)
  }
  const stopAtEos = (job.eos_ids ?? []).length > 0;
  const tokens = [];
  const times = [];
  const top = keepLogits ? { ids: [[]], values: [[]] } : null;
  let ended = false;
  let merged = 0;
  let counted = null;
  let made = null;
  let received = 0;
  let timings = null;
  if (prompt.fill !== undefined) await refill(wllama, prompt); // untimed: the cache back to the depth's filler
  const started = performance.now();
  await wllama.createCompletion({
    prompt: prompt.text,
    max_tokens: job.new_tokens + 1, // one more: its arrival closes the job's last decode step (see above)
    temperature: 0,
    top_k: 1,
    ignore_eos: !stopAtEos,
    cache_prompt: prompt.fill !== undefined, // at a depth the filler's cache is kept; else every prompt is prefilled
    n_probs: keepLogits ? job.top_k : 1, // 1: each chunk's token id
    post_sampling_probs: false,
    stream: true,
    onData: (chunk) => {
      const now = performance.now();
      const ids = chunkTokens(chunk);
      merged += Math.max(0, ids.length - 1); // a token ending mid-UTF-8 arrives with the next one
      received += ids.length;
      if (chunk.usage) [counted, made] = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens];
      if (chunk.timings) timings = chunk.timings; // llama.cpp's own clock, this generation's
      for (const id of ids) {
        if (ended) continue;
        tokens.push(id);
        times.push(now);
        if (stopAtEos && job.eos_ids.includes(id)) ended = true;
      }
      if (top) for (const step of chunkTop(chunk)) {
        top.ids[0].push(step.ids);
        top.values[0].push(step.values);
      }
    },
  });
  const total_ms = performance.now() - started;
  if (made !== received || !tokens.length) {
    // llama-server holds back a token whose text ends mid-UTF-8 (or is empty) and its last response has no ids
    throw new Error(`wllama streamed the ids of ${received} of the ${made} tokens it made (tokens whose text ` +
      'is incomplete UTF-8 at the end of a generation come back without their ids)');
  }
  if (counted !== prompt.expected) {
    const spelled = `the prompt's ${prompt.expected} ids, spelled as text for wllama, are ${counted} tokens`;
    throw new Error(`${spelled} to llama.cpp: wllama 3.x takes text only, and these ids do not survive the round trip`);
  }
  FACTS.merged_steps = Math.max(FACTS.merged_steps ?? 0, merged);
  FACTS.llama_cpp_timings = timings;
  if (!(timings?.prompt_ms > 0)) throw new Error('wllama returned no llama.cpp timings (prompt_ms): no TTFT measured');
  checkDepth(prompt, timings);
  // the job's tokens (the extra one only timed the last step; an EOS stop may end before it)
  const kept = Math.min(tokens.length, job.new_tokens);
  const steps = times.slice(1, kept).map((t, i) => t - times[i]);
  if (top) for (const row of ['ids', 'values']) top[row][0] = top[row][0].slice(0, kept);
  const step_top = top && top.ids[0].length === kept ? top : null;
  return { total_ms, ttft_ms: timings.prompt_ms, steps, tokens: [tokens.slice(0, kept)], prefill_logits: null,
    step_top };
}

// A stream chunk's token ids, from its logprobs (one entry per token it carries).
function chunkTokens(chunk) {
  const content = chunk.choices?.[0]?.logprobs?.content;
  return Array.isArray(content) ? content.map((c) => c.id) : [];
}

// A stream chunk's candidates per token: [{ids, values}] best first, values the log-probabilities llama.cpp gives.
function chunkTop(chunk) {
  const content = chunk.choices?.[0]?.logprobs?.content ?? [];
  return content.map((c) => {
    const candidates = c.top_logprobs ?? [];
    return { ids: candidates.map((t) => t.id), values: candidates.map((t) => t.logprob ?? null) };
  });
}

export async function facts(job) {
  return {
    ...FACTS, // its version and the threads it read back among them (runner.mjs adds the facts every runtime shares)
    top_values: 'log-probabilities (llama.cpp n_probs before sampling), not logits',
    stream_timing: "each chunk is read after wllama's next loop iteration (a token reaches the page one decode step " +
      'after it was chosen): one token more is made than asked, the decode steps are the differences of the kept ' +
      "tokens' arrivals (tokens 2..N's steps), and TTFT is llama.cpp's own timings.prompt_ms of the same generation",
  };
}
