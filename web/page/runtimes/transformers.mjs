// A Whisper model's speech job runs pipeline('automatic-speech-recognition') instead (speechLoad, below), and an
// inference job of a text encoder pipeline('feature-extraction') (infer, below).
// transformers.js in the page (@huggingface/transformers) as apps call it: `pipeline('text-generation', model)` over
// the onnxruntime-web it bundles, not the harness's. The model folder is job.runtime_model_base (config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json, onnx/model[_suffix].onnx for job.runtime_dtype),
// loaded with remote models off and nothing cached; its onnxruntime-web's wasm is the one served with it
// (web/runtime_dist.py), never a CDN's.
// The prompt: the job's ids as text (the pipeline's own tokenizer decodes them), which the pipeline tokenizes again
// as it does any app's text. Where its ids are the job's (checked before the first generation, and again on the ids
// the pipeline hands its generate loop), a generation is generator(text, …); where they differ, the facts say where,
// and the generation runs on the job's ids through the pipeline's model (generator.model.generate), so the tokens
// stay comparable with native ones. Greedy, exactly job.new_tokens tokens (EOS off) unless the job stops at EOS,
// with a streamer that stamps each token as transformers.js hands it to app code (put() after the token is chosen
// from logits on the CPU): TTFT from the call to the first token (the pipeline's tokenizing included: what an app
// waits for), each decode step from one token to the next. The warm-up (keepLogits) adds a logits processor that
// keeps each step's top job.top_k ids and logits (raw: every built-in processor is off, greedy) and the prefill's
// last-position logits; timed generations run without it.

const FACTS = {};
let state = null; // {tf, generator, key, load_ms}: the pipeline loaded last
let started = null; // {ep, threads}: what this page's transformers.js runtime started with

// The folder as transformers.js names a local model: env.localModelPath (its parent's path on this origin) and the
// model id. A path, not a URL: transformers.js asks whether a local file exists (the pipeline's tokenizer.json, its
// tokenizer_config.json) only of a path; of an http URL it answers no, and the pipeline would have no tokenizer.
function splitFolder(base) {
  const url = new URL(base, location.href);
  if (url.origin !== location.origin) throw new Error('a transformers.js model folder is served by the page\'s origin');
  const path = url.pathname.replace(/\/+$/, '');
  const cut = path.lastIndexOf('/');
  return { parent: path.slice(0, cut + 1), id: path.slice(cut + 1) };
}

function loadedWasm() {
  const names = performance.getEntriesByType('resource').map((e) => e.name.split('/').pop());
  return [...new Set(names.filter((n) => n.startsWith('ort-wasm')))].sort();
}

async function start(job, tools, task) {
  if (!job.runtime_model_base) throw new Error('a transformers.js job needs runtime_model_base (its model folder URL)');
  const files = tools.filesOf('transformers.js');
  const tf = await import(files + 'transformers.js');
  const { env } = tf;
  env.allowRemoteModels = false; // the Hugging Face hub is never asked
  env.allowLocalModels = true;
  env.useBrowserCache = false; // every load reads the served files, nothing kept between runs
  env.useWasmCache = false;
  env.useFSCache = false;
  const folder = splitFolder(job.runtime_model_base);
  env.localModelPath = folder.parent;
  const onnx = env.backends.onnx;
  onnx.wasm.wasmPaths = files; // its own onnxruntime-web's binary, served locally
  onnx.wasm.numThreads = job.threads;
  onnx.wasm.proxy = false;
  const started = performance.now();
  const generator = await tf.pipeline(task, folder.id, {
    dtype: job.runtime_dtype ?? 'fp32',
    device: job.ep === 'webgpu' ? 'webgpu' : 'wasm',
    local_files_only: true,
  });
  const load_ms = performance.now() - started;
  Object.assign(FACTS, {
    version: env.version,
    ort_web_version: onnx.versions?.web ?? null,
    ort_common_version: onnx.versions?.common ?? null,
    // ORT sets numThreads to 1 where it cannot start threads: read back after the session exists
    threads_effective: onnx.wasm.numThreads,
    wasm_files: loadedWasm(),
    dtype: job.runtime_dtype ?? 'fp32',
    model_type: generator.model.config?.model_type ?? null,
    pipeline: generator.task ?? task,
  });
  return { tf, generator, load_ms };
}

// The pipeline's ids for a text, tokenized as TextGenerationPipeline does (special tokens added where the
// tokenizer's config adds them).
function pipelineIds(tokenizer, text) {
  const add_special_tokens = (tokenizer.add_bos_token || tokenizer.add_eos_token) ?? false;
  const encoded = tokenizer([text], { add_special_tokens, padding: true, truncation: true });
  return Array.from(encoded.input_ids.data, Number);
}

// How the prompt reaches the model: {text} where the pipeline tokenizes the ids' text back into the same ids, else
// {text: null} (the job's ids through the pipeline's model); facts.prompt says which, and where they differ.
function promptRoute(generator, ids) {
  const tokenizer = generator.tokenizer;
  if (!tokenizer) throw new Error('the text-generation pipeline loaded no tokenizer (tokenizer_config.json not found)');
  const bos = tokenizer.bos_token_id;
  const body = tokenizer.add_bos_token && ids[0] === bos ? ids.slice(1) : ids; // the pipeline adds that BOS itself
  const text = tokenizer.decode(body, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  const again = pipelineIds(tokenizer, text);
  let at = 0;
  while (at < ids.length && at < again.length && again[at] === ids[at]) at++;
  const same = at === ids.length && again.length === ids.length;
  const facts = {
    route: same ? 'text: generator(text) tokenizes the prompt' : 'ids: generator.model.generate on the prompt ids',
    pipeline_ids_equal: same,
    prompt_length: ids.length,
    pipeline_prompt_length: again.length,
    first_differing_position: same ? null : at,
  };
  return { text: same ? text : null, facts };
}

// The prompt ids the pipeline fed its generate loop (the streamer's first put) must be the job's.
function checkFed(fed, ids) {
  if (fed.length !== ids.length || fed.some((id, i) => id !== ids[i])) {
    throw new Error(`the pipeline fed ${fed.length} prompt ids that are not the job's ${ids.length}`);
  }
}

// The pipeline of `task` on the job's folder: the one loaded last where it is the same, else a fresh one.
async function pipelineFor(job, tools, task) {
  const key = `${job.runtime_model_base} ${job.runtime_dtype} ${task}`;
  if (started && (started.ep !== job.ep || started.threads !== job.threads)) {
    // its onnxruntime-web takes its thread count and EP once per page, as the page's own ORT does
    const running = `${started.ep} with ${started.threads} threads`;
    throw new Error(`this page runs transformers.js on ${running}; open a fresh page`);
  }
  if (state?.key !== key) {
    await state?.generator.dispose();
    state = null;
    state = { ...(await start(job, tools, task)), key };
    started = { ep: job.ep, threads: job.threads };
  }
  for (const name of EARLIER_FACTS) delete FACTS[name]; // an earlier job's
  return state;
}

const EARLIER_FACTS = ['prompt', 'features', 'decoder_prompt', 'text', 'pooling', 'timed', 'tokenize_ms', 'depth_fill'];

// A text generation fills its KV cache to job.depth first (fillCache); runner.mjs asks for this before a depth job.
export const depths = true;

export async function load(job, inputs, row, tools) {
  const task = inputs.audio ? 'automatic-speech-recognition' : 'text-generation'; // a speech job carries its audio
  if (inputs.audio && job.depth > 0) throw new tools.Unsupported('transformers.js speech runs from an empty cache');
  const { tf, generator } = await pipelineFor(job, tools, task);
  if (inputs.audio) return speechLoad(tf, generator, inputs, job, state.load_ms);
  if (inputs.input_ids.dims[0] !== 1) throw new tools.Unsupported('the transformers.js pipeline runs batch 1 here');
  const ids = Array.from(inputs.input_ids.data, Number);
  const route = promptRoute(generator, ids);
  FACTS.prompt = route.facts;
  const fill = job.depth > 0 ? await fillCache(tf, generator, ids, job, tools) : null; // untimed, before the budget
  const once = (hook, keepLogits) => generateOnce(tf, generator, route.text, ids, job, hook, keepLogits, fill);
  return { load_ms: state.load_ms, once };
}

// The KV cache filled to job.depth (llama-bench's -d), untimed and once per job, with what our own loop and native ORT
// fill it with (generate.mjs's filled, harness.prepare.greedy.filler): the prompt's ids repeated to the depth, one
// forward of the pipeline's model through its own generate (one token, its cache returned: return_dict_in_generate).
// Each generation then starts from a fresh DynamicCache over these tensors (cacheOptions). On wasm they stay as they
// are (generate replaces a cache's entries, disposing only GPU ones): a cache on the GPU is refused, not shared.
// Test-only: the fault 'tjs_wrong_filler' fills with the filler reversed (the same length), which the check must see.
async function fillCache(tf, generator, ids, job, tools) {
  const depth = job.depth;
  const filler = Array.from({ length: depth }, (_, i) => ids[i % ids.length]);
  if (job.fault === 'tjs_wrong_filler') filler.reverse();
  const input_ids = new tf.Tensor('int64', BigInt64Array.from(filler, BigInt), [1, depth]);
  const attention_mask = new tf.Tensor('int64', new BigInt64Array(depth).fill(1n), [1, depth]);
  const options = { ...greedyOptions(tf, { ...job, new_tokens: 1, eos_ids: [] }, null, null), streamer: null };
  const out = await generator.model.generate({ input_ids, attention_mask, ...options, return_dict_in_generate: true });
  const cache = out.past_key_values;
  const held = cache ? cache.get_seq_length() : 0;
  if (held !== depth) throw new Error(`transformers.js filled its cache to ${held} tokens, not the job's ${depth}`);
  if (Object.values(cache).some((t) => t.location === 'gpu-buffer')) {
    throw new tools.Unsupported('transformers.js keeps this cache on the GPU, where generate disposes what it replaces');
  }
  FACTS.depth_fill = { depth, cache_length: held, filler: 'the prompt ids repeated to the depth, untimed' };
  return { cache, depth };
}

// A generation after the filled cache: a fresh DynamicCache over its tensors, and the mask over filler and prompt,
// which the pipeline's own call takes in place of its tokenizer's ({...text_inputs, ...generation_kwargs}).
function cacheOptions(tf, fill, length) {
  const span = fill.depth + length;
  const attention_mask = new tf.Tensor('int64', new BigInt64Array(span).fill(1n), [1, span]);
  return { past_key_values: new tf.DynamicCache(fill.cache), attention_mask };
}

// Inference: pipeline('feature-extraction') as an app calls it for embeddings, pooling 'none' (its last_hidden_state,
// what every other row of the case outputs; no normalize, no quantize). Each row of the job's ids is spelled as text
// by the pipeline's own tokenizer and tokenized again as the pipeline tokenizes (padding, truncation, its special
// tokens). Where that gives back the job's ids, mask and token types, a timed call is extractor(texts, {pooling:
// 'none'}): its tokenizer, model and pooling, what an app waits for. Where it does not (facts.prompt says which input
// and where), the call is the pipeline's model on the job's tensors, the step the pipeline runs after its tokenizer,
// so the row computes the other rows' inputs; its tokenizer is then outside the timing (facts.tokenize_ms: its own
// time on those texts, untimed). infer() returns {load_ms, run, encode}: runner.mjs times run() under the one stop
// rule (stop.mjs) as it times our own session.run, and encode() makes the first call's result the answer's output.
const POOLING = 'none';
const OUTPUT = 'last_hidden_state';
const FEATURE_INPUTS = ['input_ids', 'attention_mask', 'token_type_ids'];
const TOKENIZE_REPEATS = 5;

export async function infer(job, inputs, row, tools) {
  const { tf, generator, load_ms } = await pipelineFor(job, tools, 'feature-extraction');
  const tokenizer = generator.tokenizer;
  if (!tokenizer) throw new Error('the feature-extraction pipeline loaded no tokenizer (tokenizer_config.json not found)');
  const texts = rowTexts(tokenizer, inputs.input_ids);
  const route = featureRoute(tokenizer, texts, inputs);
  const feeds = Object.fromEntries(FEATURE_INPUTS.filter((name) => inputs[name])
    .map((name) => [name, new tf.Tensor('int64', inputs[name].data, inputs[name].dims)]));
  Object.assign(FACTS, { prompt: route, pooling: POOLING, tokenize_ms: tokenizeTime(tokenizer, texts) });
  FACTS.timed = route.pipeline_ids_equal
    ? `extractor(texts, {pooling: '${POOLING}'}): its tokenizer, model and pooling`
    : 'extractor.model(the job\'s tensors): the model alone (its tokenizer gives other inputs)';
  const run = route.pipeline_ids_equal
    ? () => generator(texts, { pooling: POOLING })
    : async () => hidden(await generator.model(feeds)); // pooling 'none' is the model's own output
  return { load_ms, run, encode: (result) => [tools.encodeTensor(OUTPUT, result)] };
}

// What the pipeline takes from the model's outputs before pooling (FeatureExtractionPipeline._call).
const hidden = (outputs) => outputs.last_hidden_state ?? outputs.logits ?? outputs.token_embeddings;

function rowTexts(tokenizer, ids) {
  const [batch, length] = ids.dims;
  const row = (r) => Array.from(ids.data.subarray(r * length, (r + 1) * length), Number);
  const options = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
  return Array.from({ length: batch }, (_, r) => tokenizer.decode(row(r), options));
}

// Whether the pipeline's tokenizer gives the job's inputs for the texts: its ids, mask and token types (none given:
// the zeros transformers.js's encoder_forward then feeds), each compared value by value.
function featureRoute(tokenizer, texts, inputs) {
  const theirs = tokenizer(texts, { padding: true, truncation: true }); // as FeatureExtractionPipeline._call
  for (const name of FEATURE_INPUTS.filter((n) => inputs[n])) {
    const ours = inputs[name];
    const got = theirs[name] ?? (name === 'token_type_ids' ? zerosOf(ours) : null);
    const at = firstDifference(got, ours);
    if (at !== undefined) {
      return { route: 'ids: extractor.model on the job\'s tensors', pipeline_ids_equal: false, differing_input: name,
        pipeline_dims: got ? Array.from(got.dims, Number) : null, job_dims: ours.dims, first_differing_position: at };
    }
  }
  return { route: 'text: extractor(texts) tokenizes each row', pipeline_ids_equal: true, job_dims: inputs.input_ids.dims };
}

const zerosOf = (tensor) => ({ dims: tensor.dims, data: new BigInt64Array(tensor.data.length) });

// undefined where both have the same dims and values, else [row, position] of the first difference (null where the
// dims differ: the facts give both).
function firstDifference(got, ours) {
  if (!got || got.dims.length !== 2 || got.dims.some((d, i) => Number(d) !== ours.dims[i])) return null;
  const at = got.data.findIndex((v, i) => BigInt(v) !== ours.data[i]);
  return at < 0 ? undefined : [Math.floor(at / ours.dims[1]), at % ours.dims[1]];
}

function tokenizeTime(tokenizer, texts) {
  const times = [];
  for (let i = 0; i < TOKENIZE_REPEATS; i++) {
    const started = performance.now();
    tokenizer(texts, { padding: true, truncation: true });
    times.push(performance.now() - started);
  }
  return times.sort((a, b) => a - b)[Math.floor(TOKENIZE_REPEATS / 2)];
}

// Speech (a job whose inputs carry `audio`: 16 kHz mono float32 samples, and `input_features`: the log-mel features
// native ORT ran on): pipeline('automatic-speech-recognition') on the samples, as an app hands it a recording. The
// pipeline computes its own features (its WhisperFeatureExtractor, preprocessor_config.json); they are compared
// with the job's before any generation (facts.features), since its tokens can equal native ORT's only on the same
// features. Its decoder starts from the init tokens its generation config gives (facts.decoder_prompt: the ids its
// generate loop was fed). TTFT runs from the call (features, encoder and the first step) to the first token.
async function speechLoad(tf, generator, inputs, job, load_ms) {
  if (!generator.processor) throw new Error('the speech pipeline loaded no processor (preprocessor_config.json)');
  if (inputs.audio.dtype !== 'float32') throw new Error('a speech job\'s audio is float32 samples');
  const audio = inputs.audio.data;
  const theirs = (await generator.processor(audio)).input_features;
  FACTS.features = compareFeatures(theirs, inputs.input_features);
  const once = async (hook, keepLogits) => {
    if (hook) {
      await hook(0);
      await hook(1); // before the call, as for text
    }
    const streamer = stampingStreamer(tf, 1);
    const kept = keepLogits ? { top: { ids: [[]], values: [[]] }, prefill: [] } : null;
    const started = performance.now();
    const out = await generator(audio, { ...greedyOptions(tf, job, streamer, kept), return_timestamps: false });
    const answer = generationAnswer(streamer, kept, started);
    FACTS.decoder_prompt = streamer.fed;
    FACTS.text = typeof out?.text === 'string' ? out.text.slice(0, 2000) : null;
    return answer;
  };
  return { load_ms, once };
}

// The pipeline's features beside the job's: shapes, and where both are [1, bins, frames], the largest and mean
// absolute difference.
function compareFeatures(theirs, ours) {
  const facts = { pipeline_dims: theirs.dims, job_dims: ours?.dims ?? null };
  if (!ours || ours.dims.join() !== theirs.dims.join()) return { ...facts, same_shape: false };
  let largest = 0;
  let sum = 0;
  const a = theirs.data;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - ours.data[i]);
    if (!Number.isFinite(d)) return { ...facts, same_shape: true, finite: false }; // a difference not measurable
    if (d > largest) largest = d;
    sum += d;
  }
  return { ...facts, same_shape: true, max_abs_difference: largest, mean_abs_difference: sum / a.length };
}

// put() is called with the prompt first, then with each step's chosen tokens ([[id] per row]); end() after the last.
function stampingStreamer(tf, batch) {
  const streamer = new tf.BaseStreamer();
  streamer.times = [];
  streamer.tokens = Array.from({ length: batch }, () => []);
  streamer.fed = null; // the prompt ids the generate loop was handed
  streamer.put = (value) => {
    const now = performance.now();
    if (streamer.fed === null) {
      streamer.fed = value[0].map(Number);
      return;
    }
    streamer.times.push(now);
    value.forEach((row, i) => streamer.tokens[i].push(Number(row[0])));
  };
  streamer.end = () => {};
  return streamer;
}

// The warm-up's logits processor: each step's top k ids and logits per row, and the prefill's logits.
function keepingProcessor(tf, batch, k, kept) {
  const processor = new tf.LogitsProcessor();
  processor._call = (inputIds, logits) => {
    const [rows, vocab] = logits.dims.length === 3 ? [logits.dims[0], logits.dims[2]] : logits.dims;
    const data = logits.data;
    for (let row = 0; row < rows; row++) {
      const values = data.subarray((row + 1) * vocab - vocab, (row + 1) * vocab);
      const ids = topIds(values, k);
      kept.top.ids[row].push(ids);
      kept.top.values[row].push(ids.map((i) => (Number.isFinite(values[i]) ? values[i] : null)));
      if (kept.prefill.length < batch) kept.prefill.push(Array.from(values, (v) => (Number.isFinite(v) ? v : null)));
    }
    return logits;
  };
  return processor;
}

function topIds(values, k) {
  const ids = [];
  for (let i = 0; i < values.length; i++) {
    if (ids.length === k && !(values[i] > values[ids[k - 1]])) continue;
    let at = Math.min(ids.length, k - 1);
    while (at > 0 && values[i] > values[ids[at - 1]]) at--;
    ids.splice(at, 0, i);
    if (ids.length > k) ids.pop();
  }
  return ids;
}

// The generation options every task shares: greedy, every built-in processor off, the warm-up's keeping one.
function greedyOptions(tf, job, streamer, kept) {
  const eos = job.eos_ids ?? [];
  return {
    max_new_tokens: job.new_tokens,
    min_new_tokens: null,
    do_sample: false,
    num_beams: 1,
    eos_token_id: eos.length ? eos : null, // EOS ignored: exactly new_tokens tokens, as native greedy
    repetition_penalty: 1.0,
    no_repeat_ngram_size: 0,
    suppress_tokens: null,
    begin_suppress_tokens: null,
    forced_bos_token_id: null,
    forced_eos_token_id: null,
    logits_processor: kept ? [keepingProcessor(tf, 1, job.top_k, kept)] : null,
    streamer,
  };
}

// What a generation answers from its streamer and kept logits (generate.mjs's once() shape).
function generationAnswer(streamer, kept, started) {
  const total_ms = performance.now() - started;
  const { times, tokens } = streamer;
  if (!times.length) throw new Error('transformers.js generated no token');
  const steps = times.slice(1).map((t, i) => t - times[i]);
  const prefill_logits = kept ? { dims: [1, 1, kept.prefill[0].length], values: kept.prefill.flat() } : null;
  return { total_ms, ttft_ms: times[0] - started, steps, tokens, prefill_logits, step_top: kept ? kept.top : null };
}

// One greedy generation: the pipeline on the prompt's text, or (text null) the pipeline's model on the ids; after the
// filled cache where the job has a depth (fill).
async function generateOnce(tf, generator, text, ids, job, hook, keepLogits, fill = null) {
  if (hook) {
    await hook(0);
    await hook(1); // the fault hook fires before the generation (generate() cannot be paused mid-way)
  }
  const streamer = stampingStreamer(tf, 1);
  const kept = keepLogits ? { top: { ids: [[]], values: [[]] }, prefill: [] } : null;
  const options = greedyOptions(tf, job, streamer, kept);
  if (fill) Object.assign(options, cacheOptions(tf, fill, ids.length)); // untimed, as our own loop's feeds
  const started = performance.now();
  if (text !== null) {
    await generator(text, { ...options, return_full_text: false });
  } else {
    const input_ids = new tf.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]);
    const attention_mask = new tf.Tensor('int64', new BigInt64Array(ids.length).fill(1n), [1, ids.length]);
    await generator.model.generate({ input_ids, attention_mask, ...options });
  }
  const answer = generationAnswer(streamer, kept, started);
  checkFed(streamer.fed ?? [], ids);
  return answer;
}

const GENERATION_TOP_VALUES = 'logits (a logits processor in the warm-up only; every built-in processor off: greedy)';

export async function facts(job) {
  const onnx = state?.tf.env.backends.onnx;
  if (onnx) FACTS.threads_effective = onnx.wasm.numThreads;
  return {
    ...FACTS, // its version and the threads it read back among them (runner.mjs adds the facts every runtime shares)
    wasm_files: loadedWasm(),
    ...(job.mode === 'generate' && { top_values: GENERATION_TOP_VALUES }),
  };
}
