// Encoder–decoder generation in the page (T5, Whisper): the steps harness/prepare/seq2seq.py runs natively.
// The encoder runs once (its output comes back to the CPU: the encoder's phase ends there); the first decoder
// step reads it and returns both caches, self-attention and cross-attention (computed once); every later step
// feeds back the self-attention presents, disposing the old ones, and the first step's cross-attention ones.
// A merged decoder (one session: job.seq2seq.decoder_past_url null) takes its use_cache_branch and, on the
// first step, empty pasts. The decoder starts from job.seq2seq.start_token; exactly job.new_tokens tokens.
// TTFT runs from the encoder's start to the first step's logits on the CPU; each decode step from one step's
// logits to the next's (under WebGPU the harness keeps present.* on the GPU, so only logits come back).

import { disposeAll, prefillLogits, readStep } from './generate.mjs';

const PAST_ARRAYS = { float32: Float32Array, float16: Uint16Array };
const FILLED = ['input_ids', 'attention_mask', 'input_features', 'encoder_attention_mask', 'encoder_hidden_states',
  'use_cache_branch'];

const pastOf = (present) => 'past_key_values.' + present.slice('present.'.length);

function pick(session, feeds) {
  const picked = {};
  for (const name of session.inputNames) {
    if (!(name in feeds)) throw new Error(`the graph's input '${name}' is not one encoder-decoder generation fills`);
    picked[name] = feeds[name];
  }
  return picked;
}

// A merged decoder's no-cache branch still takes every past: empty [batch, heads, 0, dim] from its metadata.
function emptyPasts(ort, session, batch) {
  const feeds = {};
  for (const meta of session.inputMetadata) {
    if (!meta.name.startsWith('past_key_values.')) {
      if (!FILLED.includes(meta.name)) throw new Error(`the graph's input '${meta.name}' is not one generation fills`);
      continue;
    }
    const [heads, width] = [meta.shape[1], meta.shape[3]];
    if (typeof heads !== 'number' || typeof width !== 'number' || !PAST_ARRAYS[meta.type]) {
      throw new Error(`past input ${meta.name}: need fixed heads and dim and a float type (got ${meta.type} [${meta.shape}])`);
    }
    feeds[meta.name] = new ort.Tensor(meta.type, new PAST_ARRAYS[meta.type](0), [batch, heads, 0, width]);
  }
  return feeds;
}

// One generation over sessions {encoder, decoder, decoderPast}; the same answer as generate.mjs's generateOnce
// plus encoder_ms. hook(step) runs before each decoder step (the test suite's fault hook).
export function seq2seqOnce(ort, sessions, inputs, job) {
  if (job.depth > 0 || job.eos_ids?.length) {
    throw new Error('encoder-decoder generation makes exactly new_tokens tokens from an empty cache: no depth, no EOS stop');
  }
  const { encoder, decoder, decoderPast } = sessions;
  const branch = (on) => new ort.Tensor('bool', Uint8Array.from([on ? 1 : 0]), [1]);
  return async (hook, keepLogits = false) => {
    const started = performance.now();
    const encoded = await encoder.run(pick(encoder, inputs));
    const hidden = encoded[encoder.outputNames[0]];
    const encoder_ms = performance.now() - started; // run() resolved: the encoder's output is on the CPU
    const batch = hidden.dims[0];
    const common = { encoder_hidden_states: hidden };
    if (inputs.attention_mask) common.encoder_attention_mask = inputs.attention_mask;
    const startIds = new BigInt64Array(batch).fill(BigInt(job.seq2seq.start_token));
    let session = decoder;
    let feeds = pick(session, { ...common, ...emptyPasts(ort, decoder, batch), use_cache_branch: branch(false),
      input_ids: new ort.Tensor('int64', startIds, [batch, 1]) });
    let selfPast = {};
    let cross = null;
    const tokens = Array.from({ length: batch }, () => []);
    const steps = [];
    let ttft_ms = null;
    let prefill_logits = null;
    // the warm-up's top job.top_k logits of each step (ids and values), checked against native ORT's
    const step_top = keepLogits ? { ids: tokens.map(() => []), values: tokens.map(() => []) } : null;
    let last = started;
    for (let step = 0; step < job.new_tokens; step++) {
      if (hook) await hook(step);
      const out = await session.run(feeds);
      const now = performance.now(); // run() resolved: the logits are on the CPU
      if (step === 0) ttft_ms = now - started;
      else steps.push(now - last);
      last = now;
      const [logitsName, ...presents] = session.outputNames;
      const next = readStep(out[logitsName], batch, job, step_top);
      if (step === 0 && keepLogits) prefill_logits = prefillLogits(out[logitsName], batch);
      out[logitsName].dispose();
      disposeAll(selfPast, Object.keys(selfPast)); // the old self-attention past: not freed, it grows every step
      selfPast = {};
      const fresh = {};
      for (const name of presents) {
        if (!name.includes('.encoder.')) selfPast[pastOf(name)] = out[name];
        else if (cross === null) fresh[pastOf(name)] = out[name];
        else out[name].dispose(); // a merged decoder's later steps return the cross-attention past as given
      }
      cross ??= fresh;
      next.forEach((token, row) => tokens[row].push(token));
      session = decoderPast;
      const ids = new ort.Tensor('int64', BigInt64Array.from(next, BigInt), [batch, 1]);
      feeds = pick(session, { ...common, ...selfPast, ...cross, use_cache_branch: branch(true), input_ids: ids });
    }
    disposeAll(selfPast, Object.keys(selfPast));
    disposeAll(cross ?? {}, Object.keys(cross ?? {}));
    hidden.dispose();
    return { total_ms: performance.now() - started, ttft_ms, steps, tokens, prefill_logits, step_top, encoder_ms };
  };
}
