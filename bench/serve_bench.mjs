// Aggregate decode speed of `tandem serve` at 1, 2, 4 and 8 concurrent streams: each client
// streams a chat completion of a fixed length; tokens/s is all clients' generated tokens over the
// wall time from the first token to the last, so the first prompt step is left out (later
// requests' prompts still interleave, as they would in service). Prints a table with the
// ratio to one stream. Not a test: a benchmark to run on a quiet machine.
//
//   node bench/serve_bench.mjs [MODEL] [--tokens N] [--threads T]
//   (MODEL defaults to models/lite-Q4_K_M.gguf: tandem gen-model --preset lite --format Q4_K_M)
import { existsSync } from 'node:fs';
import path from 'node:path';
import { repoRoot, startServer } from '../tests/server/harness.mjs';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args.splice(i, 2)[1] : fallback;
};
const tokens = Number(option('--tokens', '32'));
const threads = option('--threads', '2');
const model = path.resolve(args[0] || path.join(repoRoot, 'models/lite-Q4_K_M.gguf'));
if (!existsSync(model)) {
  console.error(`${model} not found; make it with: tandem gen-model --preset lite --format Q4_K_M -o ${model}`);
  process.exit(1);
}

async function stream(base, i) {
  const res = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: `Stream ${i}: tell a story.` }], max_tokens: tokens,
                           temperature: 0.8, seed: i, stream: true, logprobs: true, ignore_eos: true,
                           stream_options: { include_usage: true } }) });
  const reader = res.body.getReader(), decoder = new TextDecoder();
  let buffer = '', first = 0, generated = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    // Every token comes with its log-probability, so the first one marks the first token even
    // when its text is empty (the synthetic models' padding tokens decode to nothing).
    if (!first && buffer.includes('"logprobs":{"content"')) first = performance.now();
    const usage = buffer.match(/"completion_tokens":(\d+)/);
    if (usage) generated = Number(usage[1]);
  }
  return { first: first || performance.now(), last: performance.now(), generated };
}

const server = await startServer(model, ['--parallel', '8', '--ctx', '512', '--threads', threads]);
const rows = [];
try {
  await stream(server.base, 99);  // warm-up: pages, caches, threads
  for (const n of [1, 2, 4, 8]) {
    const results = await Promise.all([...Array(n).keys()].map((i) => stream(server.base, i)));
    const start = Math.min(...results.map((r) => r.first)), end = Math.max(...results.map((r) => r.last));
    const generated = results.reduce((s, r) => s + r.generated, 0);
    rows.push({ n, generated, seconds: (end - start) / 1000, tps: generated / ((end - start) / 1000) });
  }
} finally {
  await server.stop();
}
console.log(`\n${path.basename(model)}, ${threads} threads, ${tokens} tokens per stream\n`);
console.log('| streams | tokens | seconds | aggregate decode tokens/s | vs 1 stream |');
console.log('|---|---|---|---|---|');
for (const r of rows)
  console.log(`| ${r.n} | ${r.generated} | ${r.seconds.toFixed(2)} | ${r.tps.toFixed(2)} | ${(r.tps / rows[0].tps).toFixed(2)}x |`);
