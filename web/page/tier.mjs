// Is this browser's WebAssembly fit to be timed? Every engine first runs wasm on a baseline tier (V8: Liftoff;
// SpiderMonkey: its baseline compiler) and later on its optimizing one (V8: TurboFan, after a function's tiering
// budget of calls and loop iterations is spent; SpiderMonkey: Ion, per hot function with lazy tiering). A browser
// whose wasm never leaves the baseline tier (Playwright's own patched Firefox is reported to) times ORT-web
// several times slower than the browser it is named after. So once per page load, before anything is timed,
// wasmTierProbe() times a small wasm loop cold (its first calls: baseline code) and warm (the best of its last
// calls after a bounded stretch of calls), and says whether the warm code ran markedly faster than the cold.

// How the probe measures. A function's first call runs baseline code: neither engine replaces a running wasm
// frame by optimized code (no on-stack replacement for wasm in V8 or SpiderMonkey), so a first call stays on the
// baseline tier even when it spends the tiering budget that later calls profit from. So the module holds one hot
// copy, warmed for WARMUP_MS, and ROUNDS * PER_ROUND fresh copies; each round times PER_ROUND first calls of fresh
// copies (cold, baseline code) and then PER_ROUND calls of the hot copy (warm) with the same iteration count, one
// right after the other, so that a stretch of load (a browser still starting up on a busy machine) falls on both
// kinds alike. ratio: the fastest cold batch over the fastest warm one. Each copy is called once with $n = 0 right
// after instantiation (untimed): V8 compiles a function on its first call. (JavaScriptCore does replace a running
// wasm loop by optimized code: there the cold figure is partly optimized, and the ratio lower than its tiers'.)
const ROUNDS = 10;
const PER_ROUND = 4;
const WARMUP_MS = 40;
const BUDGET_MS = 300; // no round starts once the probe has run this long (the first always runs)
const MAX_WARMUP_BATCHES = 500; // a frozen clock never ends the warm-up by time
// One batch (PER_ROUND calls) of warm code lasts about BATCH_STEPS steps of the page's timer, within these bounds:
// 8 ms of a 1 ms timer is read to 1/8, 0.5 ms of a 5 µs one to 1/100.
const BATCH_STEPS = 20;
const MIN_BATCH_MS = 0.5;
const MAX_BATCH_MS = 8;
const START_ITERATIONS = 1 << 12;
const MAX_ITERATIONS = 1 << 22;
const CHECK_ITERATIONS = 1000; // the sum checked against mixReference once
// Warm code at least this many times faster than first-call code: the optimizing tier ran. Measured on this
// machine (2 CPUs; 5 page loads each, a fresh browser every time): Chromium 156 (Liftoff, then TurboFan) 4.50-4.54;
// Firefox ESR 153 (its baseline compiler, then Ion by lazy tiering) 2.13-2.67; the fault this probe is for, wasm
// kept on the baseline tier: Firefox with javascript.options.wasm_optimizingjit = false 1.03-1.07, Chromium with
// --js-flags=--liftoff-only 0.92-0.95. 1.5 lies between the two kinds (about their geometric middle). An engine
// that compiles optimized code first reads about 1 too (Chromium with --js-flags=--no-liftoff 1.00-1.02; Firefox
// with javascript.options.wasm_lazy_tiering = false, which compiles a module this small with Ion only, 1.00-1.03):
// `tiered` says a tier-up was seen, and warm_ms, read beside another browser's on the same machine, tells the two
// apart.
export const TIERED_RATIO = 1.5;

let sink = 0; // every call's result, kept so that no call is dead code

// The smallest step of performance.now() seen over `steps` ticks (runner.mjs's timer_resolution_ms too): 5 µs
// cross-origin isolated, 100 µs not (Chromium). `maxSpins` bounds the wait where the clock never moves.
export function timerStep(steps = 3, maxSpins = 1e7) {
  let smallest = Infinity;
  let last = performance.now();
  for (let seen = 0, spins = 0; seen < steps && spins < maxSpins; spins++) {
    const now = performance.now();
    if (now !== last) {
      smallest = Math.min(smallest, now - last);
      last = now;
      seen++;
    }
  }
  return smallest;
}

// {cold_ms, warm_ms (one call's time, from the fastest batch of its kind), ratio, calls (all calls made), iterations
// (of one timed call), tiered, budget_ms, elapsed_ms, rounds}; throws when this browser cannot run it (no
// WebAssembly, a clock that never moves).
export async function wasmTierProbe() {
  const started = performance.now();
  const step = timerStep();
  const batchMs = Math.min(MAX_BATCH_MS, Math.max(MIN_BATCH_MS, BATCH_STEPS * (Number.isFinite(step) ? step : 1)));
  const copies = 1 + ROUNDS * PER_ROUND;
  const { instance } = await WebAssembly.instantiate(probeModuleBytes(copies));
  const [hot, ...fresh] = Array.from({ length: copies }, (_, i) => instance.exports[`f${i}`]);
  for (const f of [hot, ...fresh]) sink ^= f(0);
  let calls = 1 + fresh.length + 1;
  if (hot(CHECK_ITERATIONS) !== mixReference(CHECK_ITERATIONS)) throw new Error('the probe module summed wrong');
  let iterations = START_ITERATIONS;
  const warmBatch = () => {
    const t = performance.now();
    for (let k = 0; k < PER_ROUND; k++) sink ^= hot(iterations);
    calls += PER_ROUND;
    return performance.now() - t;
  };
  const warmUntil = performance.now() + WARMUP_MS;
  for (let batches = 0; batches < MAX_WARMUP_BATCHES; batches++) {
    if (warmBatch() < batchMs && iterations < MAX_ITERATIONS) iterations *= 2;
    else if (performance.now() >= warmUntil) break;
  }
  const rounds = [];
  for (let r = 0; r < ROUNDS; r++) {
    const roundStart = performance.now();
    const last = rounds.at(-1);
    if (last && roundStart - started + last.cold + last.warm > BUDGET_MS) break;
    for (const f of fresh.slice(r * PER_ROUND, (r + 1) * PER_ROUND)) sink ^= f(iterations);
    calls += PER_ROUND;
    const cold = performance.now() - roundStart;
    rounds.push({ cold, warm: warmBatch() });
  }
  // Whatever else the machine does only adds time to a batch: the fastest batch of each kind is the one least
  // disturbed, and a round in which the page was descheduled does not count.
  const cold_ms = Math.min(...rounds.map((r) => r.cold)) / PER_ROUND;
  const warm_ms = Math.min(...rounds.map((r) => r.warm)) / PER_ROUND;
  if (!(warm_ms > 0)) {
    throw new Error(`performance.now() did not advance across ${PER_ROUND} calls of ${iterations} iterations`);
  }
  const ratio = cold_ms / warm_ms;
  return {
    cold_ms,
    warm_ms,
    ratio,
    calls,
    iterations,
    tiered: ratio >= TIERED_RATIO,
    budget_ms: BUDGET_MS,
    elapsed_ms: performance.now() - started,
    rounds: rounds.length,
  };
}

// The module, assembled here by hand (no toolchain): copies of one function (param $n i32) (result i32) running
// xoshiro128** over four state words for $n iterations, the state seeded from $n and every output summed into the
// result, so nothing of the loop can be folded away. Seven live i32 locals in a loop of shifts, rotates, xors and
// multiplies: the kind of code a baseline compiler keeps in memory and an optimizing one in registers.
const I32 = 0x7f;
const OP = {
  loop: 0x03, br_if: 0x0d, end: 0x0b, get: 0x20, set: 0x21, tee: 0x22, const: 0x41,
  lt_u: 0x49, add: 0x6a, mul: 0x6c, or: 0x72, xor: 0x73, shl: 0x74, rotl: 0x77,
}; // prettier-ignore
const [N, A, B, C, D, T, ACC, I] = [0, 1, 2, 3, 4, 5, 6, 7]; // the parameter, then the locals

function leb(value, signed = false) {
  const bytes = [];
  for (;;) {
    const low = value & 0x7f;
    value = signed ? value >> 7 : value >>> 7;
    const done = signed ? (value === 0 && !(low & 0x40)) || (value === -1 && low & 0x40) : value === 0;
    bytes.push(done ? low : low | 0x80);
    if (done) return bytes;
  }
}

const get = (local) => [OP.get, local];
const set = (local) => [OP.set, local];
const num = (value) => [OP.const, ...leb(value | 0, true)];
const section = (id, bytes) => [id, ...leb(bytes.length), ...bytes];

// prettier-ignore
const BODY = [
  ...get(N), ...num(0x9e3779b9), OP.xor, ...set(A),
  ...get(N), ...num(0x85ebca6b), OP.mul, ...num(1), OP.or, ...set(B),
  ...num(0x243f6a88), ...set(C),
  ...get(N), ...num(0xb7e15162), OP.xor, ...set(D),
  OP.loop, 0x40,
  ...get(ACC), ...get(B), ...num(5), OP.mul, ...num(7), OP.rotl, ...num(9), OP.mul, OP.add, ...set(ACC),
  ...get(B), ...num(9), OP.shl, ...set(T), // t = b << 9
  ...get(C), ...get(A), OP.xor, ...set(C), // c ^= a
  ...get(D), ...get(B), OP.xor, ...set(D), // d ^= b
  ...get(B), ...get(C), OP.xor, ...set(B), // b ^= c
  ...get(A), ...get(D), OP.xor, ...set(A), // a ^= d
  ...get(C), ...get(T), OP.xor, ...set(C), // c ^= t
  ...get(D), ...num(11), OP.rotl, ...set(D), // d = rotl(d, 11)
  ...get(I), ...num(1), OP.add, OP.tee, I, ...get(N), OP.lt_u, OP.br_if, 0, // while (++i < n)
  OP.end,
  ...get(ACC),
  OP.end,
];
const FUNC = [1, 7, I32, ...BODY]; // one run of 7 i32 locals, then the code

// A module of `count` copies of the function, exported as "f0", "f1", ...: each copy tiers up on its own (V8's
// tiering budget and SpiderMonkey's lazy tiering count per function), so a copy never called before runs baseline
// code however hot its siblings are.
export function probeModuleBytes(count = 1) {
  const names = Array.from({ length: count }, (_, i) => [...`f${i}`].map((c) => c.charCodeAt(0)));
  const exports = names.flatMap((name, i) => [name.length, ...name, 0x00, ...leb(i)]);
  const bodies = names.flatMap(() => [...leb(FUNC.length), ...FUNC]);
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // \0asm, version 1
    ...section(1, [1, 0x60, 1, I32, 1, I32]), // types: (i32) -> i32
    ...section(3, [...leb(count), ...names.map(() => 0)]), // functions, all of type 0
    ...section(7, [...leb(count), ...exports]),
    ...section(10, [...leb(count), ...bodies]),
  ]); // prettier-ignore
}
// The xoshiro128** sum the module computes, in plain JS: the probe checks the wasm against it once.
export function mixReference(n) {
  let [a, b, c, d] = [(n ^ 0x9e3779b9) | 0, Math.imul(n, 0x85ebca6b) | 1, 0x243f6a88, (n ^ 0xb7e15162) | 0];
  let acc = 0;
  let i = 0;
  do {
    acc = (acc + Math.imul(rotl(Math.imul(b, 5), 7), 9)) | 0;
    const t = b << 9;
    c ^= a;
    d ^= b;
    b ^= c;
    a ^= d;
    c ^= t;
    d = rotl(d, 11);
    i = (i + 1) | 0;
  } while (i >>> 0 < n >>> 0);
  return acc;
}

function rotl(x, k) {
  return (x << k) | (x >>> (32 - k));
}
