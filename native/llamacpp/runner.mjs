// llama.cpp for the native engine (harness/native/llamacpp_backend.py): node-llama-cpp's prebuilt CPU binary,
// one GGUF, greedy generation on prompt ids given directly (never tokenized here).
//
// A JSON object per line on stdin; a JSON object per line on stdout (llama.cpp's own log goes to stderr):
//   {"op": "probe"}                                  -> {"ok": true, "facts": {...}}
//   {"op": "load", "path", "threads", "contextCap"}
//                                                    -> {"ok": true, "facts": {...}}
//   {"op": "generate", "ids": [...], "newTokens": n, "eos": [...], "top": k}
//                                -> {"t": id, "top": [[id, logit], ...], "lw": w with k} as each token is chosen, then
//                                   {"done": n}; w: the step's sum of exp(logit - max logit), for log-probabilities
//   {"op": "tokenize", "text"}                       -> {"ids": [...]} (llama.cpp's tokenizer, no BOS added)
//   {"op": "echo"}                                   -> {"echo": true} (the pipe's own round trip, measured)
// Any failure: {"error": "..."}; the process stays up for the next request.
import { createInterface } from "node:readline";
import { readFileSync } from "node:fs";
import { basename } from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const here = new URL(".", import.meta.url);
let llama = null;
let model = null;
let context = null;
let sequence = null;

function send(message) {
    process.stdout.write(JSON.stringify(message) + "\n");
}

async function start() {
    if (llama) return llama;
    llama = await getLlama({
        gpu: false, // the CPU binary
        build: "never", // never compile llama.cpp here: the prebuilt binary or nothing
        usePrebuiltBinaries: true,
        skipDownload: true,
        progressLogs: false,
        maxThreads: 0, // a context's threads are then exactly what it asks (currentThreads reads them back)
        logLevel: LlamaLogLevel.error,
        logger: (level, message) => process.stderr.write(`[llama.cpp ${level}] ${message}\n`),
    });
    return llama;
}

function packageVersion() {
    const json = JSON.parse(readFileSync(new URL("node_modules/node-llama-cpp/package.json", here), "utf8"));
    return json.version;
}

function llamaFacts() {
    return {
        node_llama_cpp_version: packageVersion(),
        llama_cpp_release: `${llama.llamaCppRelease.repo}@${llama.llamaCppRelease.release}`,
        llama_cpp_build_type: llama.buildType, // prebuilt | localBuild
        llama_cpp_gpu: llama.gpu, // false: CPU
        llama_cpp_cpu_math_cores: llama.cpuMathCores,
        llama_cpp_system_info: llama.systemInfo,
        node_version: process.version,
    };
}

let contextOptions = null;

async function makeContext(size) {
    if (context) await context.dispose();
    context = await model.createContext({ ...contextOptions, contextSize: size, sequences: 1 });
    sequence = context.getSequence();
}

async function load({ path, threads, contextCap }) {
    await start();
    if (model) await model.dispose();
    context = null;
    model = await llama.loadModel({ modelPath: path, gpuLayers: 0, useMmap: true });
    // threads undefined: node-llama-cpp's default (cpuMathCores, maxThreads being 0)
    contextOptions = { threads: threads ?? undefined };
    await makeContext(Math.min(model.trainContextSize, contextCap));
    const general = model.fileInfo.metadata.general ?? {};
    return {
        ...llamaFacts(),
        gguf_file: basename(path),
        gguf_file_type: general.file_type ?? null,
        gguf_architecture: general.architecture ?? null,
        model_size_bytes: model.size,
        train_context_size: model.trainContextSize,
        context_size: context.contextSize,
        batch_size: context.batchSize,
        threads_ideal: context.idealThreads,
        threads_current: context.currentThreads,
        bos: model.tokens.bos ?? null,
        add_bos: model.tokens.shouldPrependBosToken,
    };
}

async function generate({ ids, newTokens, eos, top }) {
    const needed = ids.length + newTokens;
    if (needed > context.contextSize) {
        if (needed > model.trainContextSize)
            throw new Error(`${needed} positions asked; the model has ${model.trainContextSize}`);
        await makeContext(needed); // a larger context: in a case's first generation, which is never timed
    }
    await sequence.clearHistory(); // a fresh KV cache: every generation starts from the prompt
    const stops = new Set(eos ?? []);
    // greedy (temperature 0: the argmax); with `top`, each step's top-`top` raw logits too (token checks)
    const logits = top ? { logits: { filter: { includeTop: top } }, totalLogitWeight: true } : {};
    const next = { token: true, ...logits, options: { temperature: 0 } };
    let input = [...ids.slice(0, -1), [ids[ids.length - 1], { generateNext: next }]];
    let made = 0;
    while (made < newTokens) {
        const [result] = (await sequence.controlledEvaluate(input)).slice(-1);
        const token = result?.next?.token;
        if (token == null) throw new Error("llama.cpp chose no token");
        const line = { t: token };
        if (top) {
            line.top = [...result.next.logits.entries()].sort((a, b) => b[1] - a[1]).slice(0, top);
            line.lw = result.next.totalLogitWeight ?? null;
        }
        send(line);
        made += 1;
        if (stops.has(token)) break;
        input = [[token, { generateNext: next }]];
    }
    return { done: made, threads_current: context.currentThreads };
}

const requests = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of requests) {
    if (!line.trim()) continue;
    let request;
    try {
        request = JSON.parse(line);
        if (request.op === "echo") send({ echo: true });
        else if (request.op === "probe") {
            await start();
            send({ ok: true, facts: llamaFacts() });
        } else if (request.op === "load") send({ ok: true, facts: await load(request) });
        else if (request.op === "generate") send(await generate(request));
        else if (request.op === "tokenize") send({ ids: Array.from(model.tokenize(String(request.text))) });
        else send({ error: `unknown op ${JSON.stringify(request.op)}` });
    } catch (error) {
        send({ error: String(error?.stack ?? error).slice(0, 2000) });
    }
}
if (model) await model.dispose();
if (llama) await llama.dispose();
