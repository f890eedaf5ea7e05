// Logits of every position of a token sequence, computed by llama.cpp through node-llama-cpp's
// prebuilt CPU binaries (an optional cross-check of the fixtures and of forward.py; see
// tests/test_reference.py::test_reference_agrees_with_llama_cpp).
//
//   node llama_cpp_logits.mjs NODE_MODULES_PARENT MODEL TOKENS_CSV OUT_JSON
//
// The KV cache is kept in F32 and flash attention off, so an F32 model's logits match a float64
// reference to ~1e-6 relative.
import {join} from "node:path";
import {writeFileSync} from "node:fs";
import {pathToFileURL} from "node:url";

const [, , moduleDir, modelPath, toksCsv, outPath] = process.argv;
const entry = join(moduleDir, "node_modules", "node-llama-cpp", "dist", "index.js");
const {getLlama} = await import(pathToFileURL(entry).href);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath});
const ctx = await model.createContext({
    contextSize: 256, batchSize: 256, threads: 1, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const toks = toksCsv.split(",").map(Number);
const out = await ctx.getSequence().controlledEvaluate(toks.map((t) => [t, {generateNext: {logits: true}}]));
const rows = out.map((o) => {
    const row = [];
    for (const [k, v] of o.next.logits) row[k] = v;
    return row;
});
writeFileSync(outPath, JSON.stringify({rows}));
process.exit(0);
