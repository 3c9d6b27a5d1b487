// Generation in the page: greedy decoding on the `-past` export, the steps harness/prepare/greedy.py runs
// natively. Prefill: the prompt, a mask of ones, positions, and empty past tensors typed from the session's
// input metadata; decode: one token per step, each step's presents fed back as the next step's past and the
// old past disposed; exactly job.new_tokens tokens (EOS ignored) or, where the job carries eos_ids
// (--stop-at-eos), up to them, ending once every row made one; argmax here. A step's clock stops when its
// logits are on the CPU (the harness asks WebGPU to keep present.* on the GPU and return logits only).
// TTFT is the prefill until the first logits; each decode step runs from one step's logits to the next's.
// At a depth (job.depth), the KV cache is first filled to that many tokens, untimed; the clock starts after.

import { loopStop } from './stop.mjs';

const PAST_ARRAYS = { float32: Float32Array, float16: Uint16Array };

// present_key_0 -> past_key_0; Optimum's present.0.key -> past_key_values.0.key
function pastOf(present) {
  if (present.startsWith('present.')) return 'past_key_values.' + present.slice('present.'.length);
  return 'past' + present.slice('present'.length);
}

// The inputs generation fills (greedy.FILLED); any other one is refused by name.
const FILLED = ['input_ids', 'attention_mask', 'position_ids', 'use_cache_branch'];

// shape: [heads, dim] from a model folder's config (job.past_shape), for graphs that leave them symbolic
function emptyPast(ort, session, batch, shape) {
  const feeds = {};
  for (const meta of session.inputMetadata) {
    if (!meta.name.startsWith('past')) {
      if (!FILLED.includes(meta.name)) throw new Error(`the graph's input '${meta.name}' is not one generation fills`);
      continue;
    }
    const fixed = typeof meta.shape[1] === 'number' && typeof meta.shape[3] === 'number';
    const [heads, width] = fixed ? [meta.shape[1], meta.shape[3]] : shape ?? [];
    if (typeof heads !== 'number' || typeof width !== 'number' || !PAST_ARRAYS[meta.type]) {
      throw new Error(`past input ${meta.name}: need a ${Object.keys(PAST_ARRAYS)} [batch, heads, past, dim] tensor with ` +
        `fixed heads and dim, or a config beside the graph that says them (got ${meta.type} [${meta.shape}])`);
    }
    feeds[meta.name] = new ort.Tensor(meta.type, new PAST_ARRAYS[meta.type](0), [batch, heads, 0, width]);
  }
  return feeds;
}

// transformers' position ids: counted over the unpadded tokens, padding positions get 1 (greedy.positions)
function positions(ort, mask, batch, length, last) {
  const out = new BigInt64Array(batch * last);
  for (let row = 0; row < batch; row++) {
    let count = -1n;
    for (let i = 0; i < length; i++) {
      const on = mask[row * length + i] !== 0n;
      if (on) count++;
      if (i >= length - last) out[row * last + i - (length - last)] = on ? count : 1n;
    }
  }
  return new ort.Tensor('int64', out, [batch, last]);
}

// Each row's count of real (unmasked) tokens: the position the next token takes (as positions() counts).
function realTokens(mask, batch, length) {
  const counts = new BigInt64Array(batch);
  for (let row = 0; row < batch; row++) {
    for (let i = 0; i < length; i++) if (mask[row * length + i] !== 0n) counts[row] += 1n;
  }
  return counts;
}

function withOnes(mask, batch, length) {
  const grown = new BigInt64Array(batch * (length + 1));
  for (let row = 0; row < batch; row++) {
    grown.set(mask.subarray(row * length, (row + 1) * length), row * (length + 1));
    grown[row * (length + 1) + length] = 1n;
  }
  return grown;
}

function halfToFloat(h) {
  const sign = h & 0x8000 ? -1 : 1;
  const exponent = (h >> 10) & 0x1f;
  const fraction = h & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 31) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

// The last position's logits of one row: a view into the output, no copy (the decode step's clock runs).
export function lastRow(logits, row) {
  const [, positionsKept, vocab] = logits.dims;
  const start = (row * positionsKept + positionsKept - 1) * vocab;
  return logits.data.subarray(start, start + vocab);
}

// float16 logits arrive as raw halves (Uint16Array) where the browser has no Float16Array, as numbers where
// it has one (onnxruntime-common picks): only raw halves are decoded (a copy); numbers are read in place.
const asNumbers = (values) => (values instanceof Uint16Array ? Float32Array.from(values, halfToFloat) : values);

export function argmax(values) {
  const numbers = asNumbers(values);
  let best = 0;
  for (let i = 1; i < numbers.length; i++) if (numbers[i] > numbers[best]) best = i;
  return best;
}

// The prefill's last-position logits of every row as numbers, for the parity check (the warm-up's only).
export function prefillLogits(logits, batch) {
  const rows = Array.from({ length: batch }, (_, row) => Array.from(asNumbers(lastRow(logits, row))));
  return { dims: [batch, 1, rows[0].length], values: rows.flat() };
}

// The k largest logits of one row's last position, best first, as [ids, values] (null for a non-finite value):
// what the harness checks this step against native ONNX Runtime's (harness.core.generation.token_check).
// A pass over the vocabulary keeping k, for the warm-up only.
export function topK(values, k) {
  const numbers = asNumbers(values);
  const rank = (i) => (Number.isNaN(numbers[i]) ? Infinity : numbers[i]); // a NaN is kept: the check must see it
  const ids = [];
  for (let i = 0; i < numbers.length; i++) {
    if (ids.length === k && rank(i) <= rank(ids[k - 1])) continue;
    let at = Math.min(ids.length, k - 1);
    while (at > 0 && rank(i) > rank(ids[at - 1])) at--;
    ids.splice(at, 0, i);
    if (ids.length > k) ids.pop();
  }
  return [ids, ids.map((i) => (Number.isFinite(numbers[i]) ? numbers[i] : null))];
}

// One step's logits read on the CPU: each row's greedy token, and (the warm-up's `stepTop`, else null) each
// row's top job.top_k ids and logits appended; the one reading of a step, decoder-only and encoder-decoder alike.
export function readStep(logits, batch, job, stepTop) {
  const next = Array.from({ length: batch }, (_, row) => argmax(lastRow(logits, row)));
  if (stepTop) {
    for (let row = 0; row < batch; row++) {
      const [ids, values] = topK(lastRow(logits, row), job.top_k);
      stepTop.ids[row].push(ids);
      stepTop.values[row].push(values);
    }
  }
  return next;
}

export function disposeAll(feeds, names) {
  for (const name of names) feeds[name]?.dispose();
}

// One generation. hook(step) runs before each step's run (the test suite's fault hook, mid-generation).
// keepLogits: the untimed warm-up keeps the prefill's logits and each step's top job.top_k (ids and logits);
// the timed generations never copy them.
// optimum's merged decoder: its no-cache branch for the prefill, the cache branch for each decode step
const branch = (ort, on) => new ort.Tensor('bool', Uint8Array.from([on ? 1 : 0]), [1]);

// The KV cache filled to job.depth tokens (llama-bench's -d), untimed and once per job: a prefill of each row's
// prompt repeated (greedy.filler), whose presents are the prompt's past in every generation (a session never
// writes to its inputs, so it is read again, as native ORT's loop does). Returns the prompt's feeds and mask.
async function filled(ort, session, prompt, job) {
  const taken = new Set(session.inputNames);
  const [batch, promptLength] = prompt.ids.dims;
  const depth = job.depth;
  const ids = new BigInt64Array(batch * depth);
  for (let row = 0; row < batch; row++) {
    for (let i = 0; i < depth; i++) ids[row * depth + i] = prompt.ids.data[row * promptLength + (i % promptLength)];
  }
  const ones = new BigInt64Array(batch * depth).fill(1n);
  const fill = { input_ids: new ort.Tensor('int64', ids, [batch, depth]),
    attention_mask: new ort.Tensor('int64', ones, [batch, depth]), ...emptyPast(ort, session, batch, job.past_shape) };
  if (taken.has('position_ids')) fill.position_ids = positions(ort, ones, batch, depth, depth);
  if (taken.has('use_cache_branch')) fill.use_cache_branch = branch(ort, false);
  const [logitsName, ...presents] = session.outputNames;
  const out = await session.run(fill);
  out[logitsName].dispose();
  const mask = new BigInt64Array(batch * (depth + promptLength));
  for (let row = 0; row < batch; row++) {
    mask.set(ones.subarray(row * depth, (row + 1) * depth), row * (depth + promptLength));
    mask.set(prompt.mask.data.subarray(row * promptLength, (row + 1) * promptLength), row * (depth + promptLength) + depth);
  }
  const feeds = { input_ids: prompt.ids, attention_mask: new ort.Tensor('int64', mask, [batch, depth + promptLength]) };
  presents.forEach((name) => (feeds[pastOf(name)] = out[name]));
  if (taken.has('use_cache_branch')) feeds.use_cache_branch = branch(ort, true);
  return { feeds, mask, dispose: () => presents.forEach((name) => out[name].dispose()) };
}

// fill: the cache filled to job.depth (filled()), shared by the job's generations: its past is not disposed here.
async function generateOnce(ort, session, prompt, job, hook, keepLogits = false, fill = null) {
  const [batch, promptLength] = prompt.ids.dims;
  const [logitsName, ...presents] = session.outputNames;
  const pasts = presents.map(pastOf);
  const taken = new Set(session.inputNames);
  let mask = fill ? fill.mask : prompt.mask.data;
  let feeds = fill
    ? { ...fill.feeds }
    : { input_ids: prompt.ids, attention_mask: prompt.mask, ...emptyPast(ort, session, batch, job.past_shape) };
  let length = mask.length / batch;
  if (taken.has('position_ids')) feeds.position_ids = positions(ort, mask, batch, length, promptLength);
  // a decode step's position ids, counted on from the prompt's real tokens rather than recounted each step
  let nextPositions = taken.has('position_ids') ? realTokens(mask, batch, length) : null;
  if (taken.has('use_cache_branch') && !fill) feeds.use_cache_branch = branch(ort, false);
  const tokens = Array.from({ length: batch }, () => []);
  const steps = [];
  const eos = new Set(job.eos_ids || []); // empty: EOS ignored, exactly job.new_tokens tokens
  const ended = new Array(batch).fill(false);
  let ttft_ms = null;
  let prefill_logits = null;
  const step_top = keepLogits ? { ids: tokens.map(() => []), values: tokens.map(() => []) } : null;
  const started = performance.now();
  let last = started;
  for (let step = 0; step < job.new_tokens; step++) {
    if (hook) await hook(step);
    const out = await session.run(feeds);
    const now = performance.now(); // run() resolved: the logits are on the CPU
    if (step === 0) ttft_ms = now - started;
    else steps.push(now - last);
    last = now;
    const next = readStep(out[logitsName], batch, job, step_top);
    if (step === 0 && keepLogits) prefill_logits = prefillLogits(out[logitsName], batch);
    out[logitsName].dispose();
    if (!(fill && step === 0)) disposeAll(feeds, pasts); // the old past: a cache not freed here grows every step
    next.forEach((token, row) => tokens[row].push(token));
    next.forEach((token, row) => (ended[row] ||= eos.has(token)));
    if (eos.size && ended.every(Boolean)) {
      presents.forEach((name) => out[name].dispose()); // no next step takes them
      feeds = {};
      break;
    }
    mask = withOnes(mask, batch, length);
    length++;
    feeds = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(next, BigInt), [batch, 1]),
      attention_mask: new ort.Tensor('int64', mask, [batch, length]),
    };
    if (nextPositions) {
      feeds.position_ids = new ort.Tensor('int64', nextPositions, [batch, 1]);
      nextPositions = nextPositions.map((position) => position + 1n);
    }
    if (taken.has('use_cache_branch')) feeds.use_cache_branch = branch(ort, true);
    presents.forEach((name, i) => (feeds[pasts[i]] = out[name]));
  }
  disposeAll(feeds, pasts);
  return { total_ms: performance.now() - started, ttft_ms, steps, tokens, prefill_logits, step_top };
}

function sameTokens(a, b) {
  return a.length === b.length && a.every((row, i) => row.join(',') === b[i].join(','));
}

// A page's first generations are slower than its steady ones while the engine's wasm (or shaders) is still being
// compiled and tiered up (llama-small at 1 thread: 112, 116, 90, 73, ... 52-57 ms per generation), and a decode
// rate is the steps' count over their summed time: one warm-up left those generations in the row's figure. So the
// page warms up until the generation time stops falling: at least job.warmup (--warmup) generations after the
// first, then on until none of the last WARM_PATIENCE is more than WARM_FALL faster than the fastest before them;
// never more than job.max_warmup (harness.core.generation.PAGE_MAX_WARMUP_GENERATIONS), and never past the case's
// budget (the timed loop then still takes its min_iterations). Pure: times are the warm-up generations' ms (the
// first generation, which keeps its logits, is not one of them).
export const WARM_PATIENCE = 3;
export const WARM_FALL = 0.05;

export function warmedUp(times, warmup, most) {
  const n = times.length;
  if (n >= most) return true;
  if (n < Math.max(warmup, WARM_PATIENCE + 1)) return false;
  const best = Math.min(...times.slice(0, n - WARM_PATIENCE));
  return times.slice(n - WARM_PATIENCE).every((t) => t >= (1 - WARM_FALL) * best);
}

// One untimed generation that keeps its tokens and prefill logits (the row's), untimed warm-up generations until
// the time stops falling (warmedUp), then timed generations under the usual stop rule (stop.mjs, as runner.mjs's
// measure): the count and the duration met, capped by max_iterations, stopped by the budget but never below
// min_iterations. hooks: {fault(step), memory(), loopMark(mark)} from runner.mjs. The page's memory is measured
// after the warm-up and after the repeats.
// once(hook, keepLogits): one generation; an encoder-decoder's (seq2seq.mjs) also says its encoder_ms.
export async function measureGeneration(ort, session, inputs, job, hooks, once = null) {
  const prompt = { ids: inputs.input_ids, mask: inputs.attention_mask };
  if (!once && (!prompt.ids || !prompt.mask)) throw new Error('a generate job needs input_ids and attention_mask');
  const fill = !once && job.depth > 0 ? await filled(ort, session, prompt, job) : null; // untimed, before the budget
  const generate = once ?? ((hook, keepLogits) => generateOnce(ort, session, prompt, job, hook, keepLogits, fill));
  const t0 = performance.now();
  const deadline = job.max_time_ms == null ? Infinity : t0 + job.max_time_ms;
  const first = await generate(null, true);
  const warm = [];
  // on until the time stops falling and, whatever it does, for at least job.min_warmup_ms (harness.core.generation.
  // page_min_warmup_ms: the optimizing tier swaps code in seconds after load, past a plateau "stops falling" sees)
  const warming = () => performance.now() - t0 < (job.min_warmup_ms ?? 0) || !warmedUp(warm, job.warmup, job.max_warmup);
  while (warming() && performance.now() < deadline) {
    warm.push((await generate(null, false)).total_ms);
  }
  const warmup_ms = performance.now() - t0;
  const warmed = !warming();
  const memory_before = await hooks.memory();
  const samples = [];
  const ttft = [];
  const steps = [];
  const encoder = [];
  let tokens_stable = true;
  await hooks.loopMark('start');
  const stop = loopStop(job, deadline);
  let loop_stopped = false;
  for (;;) {
    const n = samples.length;
    const why = stop(n);
    if (why !== null) {
      loop_stopped = why === 'budget';
      break;
    }
    const hook = n === 0 ? (step) => (step === 1 ? hooks.fault() : null) : null;
    const one = await generate(hook, false);
    samples.push(one.total_ms);
    if (one.encoder_ms != null) encoder.push(one.encoder_ms);
    ttft.push(one.ttft_ms);
    steps.push(one.steps);
    tokens_stable &&= sameTokens(one.tokens, first.tokens);
  }
  await hooks.loopMark('end');
  fill?.dispose();
  const memory_after = await hooks.memory();
  return {
    first_run_ms: first.total_ms,
    samples,
    generation: {
      ttft_samples_ms: ttft,
      step_samples_ms: steps,
      tokens: first.tokens,
      tokens_stable,
      prefill_logits: first.prefill_logits,
      step_top: first.step_top,
      memory_before,
      memory_after,
      warmup_generations: 1 + warm.length,
      warmup_samples_ms: warm.slice(-job.max_warmup), // the last ones: a tiny model's floor is thousands
      warmup_ms,
      ...(job.seq2seq && { encoder_samples_ms: encoder }),
    },
    budget: {
      max_time_s: job.max_time_ms == null ? null : job.max_time_ms / 1000,
      warmup_run: warm.length,
      budget_stopped: loop_stopped || !warmed,
    },
  };
}

// One position's scores against the passage's next id: its negative log-likelihood, its argmax and, where the fp32
// reference's log-probabilities are given (a row of them, renormalized here in doubles), KL(P_fp32 || P_row).
function scorePosition(values, next, reference) {
  const numbers = asNumbers(values);
  let top = 0;
  for (let i = 1; i < numbers.length; i++) if (numbers[i] > numbers[top]) top = i;
  let sum = 0;
  for (let i = 0; i < numbers.length; i++) sum += Math.exp(numbers[i] - numbers[top]);
  const lse = numbers[top] + Math.log(sum);
  const scored = { nll: lse - numbers[next], argmax: top, kl: null };
  if (reference) {
    if (reference.length !== numbers.length) throw new Error(`the fp32 reference is ${reference.length} wide, the logits ${numbers.length}`);
    let peak = -Infinity;
    for (let i = 0; i < reference.length; i++) peak = Math.max(peak, reference[i]);
    let refSum = 0;
    for (let i = 0; i < reference.length; i++) refSum += Math.exp(reference[i] - peak);
    const refLse = peak + Math.log(refSum);
    let kl = 0;
    for (let i = 0; i < reference.length; i++) {
      const p = reference[i] - refLse;
      kl += Math.exp(p) * (p - (numbers[i] - lse));
    }
    scored.kl = kl;
  }
  return scored;
}

function disposeOutputs(out) {
  for (const tensor of Object.values(out)) tensor.dispose();
}

// The perplexity passage (harness/prepare/perplexity.py), untimed after the timed loop: job.passage.ids forced from
// an empty KV cache, batch 1, as native engines force them: one prefill where the graph returns every position's
// logits, else the first id's prefill and one step per id (the harness's export returns the last position's only).
// Returns each predicted position's NLL, argmax and KL beside the fp32 reference (served as float32 rows), and how;
// or, where it must step and its first PROBE_STEPS steps' pace projects past the case's budget (job.max_time_ms),
// what it skipped and why, as native engines stop (harness/prepare/perplexity.py StepBudget).
const PROBE_STEPS = 4;

export async function passageScores(ort, session, job, fetchBytes) {
  const ids = job.passage.ids;
  const length = ids.length;
  const reference = job.passage.reference_url
    ? new Float32Array((await fetchBytes(job.passage.reference_url)).buffer) : null;
  const width = reference ? reference.length / (length - 1) : 0;
  const referenceRow = (t) => (reference ? reference.subarray(t * width, (t + 1) * width) : null);
  const [logitsName, ...presents] = session.outputNames;
  const pasts = presents.map(pastOf);
  const taken = new Set(session.inputNames);
  const scores = { nll: [], argmax: [], kl: reference ? [] : null, method: 'prefill' };
  const keep = (values, t) => {
    const one = scorePosition(values, ids[t + 1], referenceRow(t));
    scores.nll.push(one.nll);
    scores.argmax.push(one.argmax);
    if (reference) scores.kl.push(one.kl);
  };
  const feedsOf = (chunk, start, past) => {
    const ones = new BigInt64Array(start + chunk.length).fill(1n);
    const feeds = { input_ids: new ort.Tensor('int64', BigInt64Array.from(chunk, BigInt), [1, chunk.length]),
      attention_mask: new ort.Tensor('int64', ones, [1, ones.length]), ...past };
    if (taken.has('position_ids')) feeds.position_ids = positions(ort, ones, 1, ones.length, chunk.length);
    if (taken.has('use_cache_branch')) feeds.use_cache_branch = branch(ort, start > 0);
    return feeds;
  };
  let out = await session.run(feedsOf(ids, 0, emptyPast(ort, session, 1, job.past_shape)));
  const whole = out[logitsName];
  if (whole.dims[1] === length) {
    const vocab = whole.dims[2];
    const data = whole.data;
    for (let t = 0; t < length - 1; t++) keep(data.subarray(t * vocab, (t + 1) * vocab), t);
    disposeOutputs(out);
    return scores;
  }
  disposeOutputs(out);
  scores.method = 'steps';
  const steps = length - 1;
  const started = performance.now();
  let feeds = feedsOf(ids.slice(0, 1), 0, emptyPast(ort, session, 1, job.past_shape));
  for (let t = 0; t < steps; t++) {
    out = await session.run(feeds);
    keep(lastRow(out[logitsName], 0), t);
    out[logitsName].dispose();
    disposeAll(feeds, pasts);
    const past = Object.fromEntries(presents.map((name, i) => [pasts[i], out[name]]));
    const pace = (performance.now() - started) / (t + 1);
    const over = t + 1 >= PROBE_STEPS && job.max_time_ms != null && pace * steps > job.max_time_ms;
    if (t === steps - 1 || over) {
      Object.values(past).forEach((tensor) => tensor.dispose());
      if (over && t < steps - 1) {
        return { skipped: { steps, step_ms: pace, estimate_ms: pace * steps, limit_ms: job.max_time_ms } };
      }
      break;
    }
    feeds = feedsOf(ids.slice(t + 1, t + 2), t + 1, past);
  }
  return scores;
}
