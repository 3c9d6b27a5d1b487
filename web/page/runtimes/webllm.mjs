// WebLLM (MLC/TVM) in the page: not runnable here. It runs a model only through its TVM-compiled model library (a
// .wasm built for that model and WebGPU) and MLC-converted weights (mlc-chat-config.json, params shards), and the
// harness is given neither; the module answers `unsupported` with that reason for every job.

const REASON =
  'WebLLM needs its TVM-compiled model library (.wasm) and MLC weights (mlc-chat-config.json, params shards); ' +
  'none is given (--webllm-model DIR)';

// Why this runtime cannot run the job (the page asks before anything else): always.
export function refuse() {
  return REASON;
}

export async function load(job, inputs, row, tools) {
  throw new tools.Unsupported(REASON);
}

export async function facts() {
  return {}; // nothing ran: the facts every runtime shares (runner.mjs) are all it has
}
