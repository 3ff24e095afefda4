// Time to first token of a long chat with the prefix cache on and off: a history of about
// --history tokens, then --turns turns, each adding the previous reply and a short question.
// The same conversation runs against a server with the cache and one started with
// --no-prefix-cache; the replies must be identical (log-probabilities included), and the table
// gives each turn's time to first token on both and the share of its prompt taken from the cache.
// Not a test: a benchmark to run on a quiet machine.
//
//   node bench/prefix_cache_bench.mjs [MODEL] [--history N] [--turns N] [--tokens N] [--threads T]
//   (MODEL defaults to models/lite-Q4_K_M.gguf: tandem gen-model --preset lite --format Q4_K_M)
import { existsSync } from 'node:fs';
import path from 'node:path';
import { repoRoot, startServer } from '../tests/server/harness.mjs';

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 ? args.splice(i, 2)[1] : fallback;
};
const history = Number(option('--history', '3000'));
const turns = Number(option('--turns', '10'));
const tokens = Number(option('--tokens', '16'));
const threads = option('--threads', '2');
const model = path.resolve(args[0] || path.join(repoRoot, 'models/lite-Q4_K_M.gguf'));
if (!existsSync(model)) {
  console.error(`${model} not found; make it with: tandem gen-model --preset lite --format Q4_K_M -o ${model}`);
  process.exit(1);
}

// About 4 tokens a word in DeepSeek's vocabulary (the table prints the real counts).
const document = Array.from({ length: Math.ceil(history / 4) }, (_, i) => `item${(i * 37) % 1009}`).join(' ');

async function ask(base, messages, seed) {
  const start = performance.now();
  const res = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: tokens, temperature: 0.8, seed, stream: true, logprobs: true,
                           ignore_eos: true, stream_options: { include_usage: true } }) });
  if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const reader = res.body.getReader(), decoder = new TextDecoder();
  let buffer = '', first = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    if (!first && buffer.includes('"logprobs":{"content"')) first = performance.now();
  }
  let content = '', logprobs = [], usage = null;
  for (const event of buffer.split('\n\n')) {
    if (!event.startsWith('data: {')) continue;
    const chunk = JSON.parse(event.slice(6));
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices && chunk.choices[0];
    if (choice && choice.delta.content) content += choice.delta.content;
    if (choice && choice.logprobs) logprobs.push(...choice.logprobs.content.map((t) => t.logprob));
  }
  return { ttft: (first - start) / 1000, content, logprobs, usage };
}

async function conversation(extraArgs) {
  const server = await startServer(model, ['--parallel', '2', '--ctx', String(history + turns * (tokens + 60) + 1024),
                                           '--threads', threads, ...extraArgs]);
  const results = [];
  try {
    await ask(server.base, [{ role: 'user', content: 'warm up' }], 1);  // pages, caches, threads
    const messages = [{ role: 'system', content: 'Answer from the document.' },
                      { role: 'user', content: `Document: ${document}\nWhat is the first item?` }];
    for (let turn = 0; turn < turns; turn++) {
      const r = await ask(server.base, messages, 100 + turn);
      results.push(r);
      messages.push({ role: 'assistant', content: r.content }, { role: 'user', content: `Turn ${turn}: and the next one?` });
      process.stderr.write(`turn ${turn}: ${r.ttft.toFixed(2)} s to the first token\n`);
    }
  } finally {
    await server.stop();
  }
  return results;
}

const on = await conversation([]);
const off = await conversation(['--no-prefix-cache']);
console.log(`\n${path.basename(model)}, ${threads} threads, ${tokens} tokens a reply\n`);
console.log('| turn | prompt tokens | from the cache | first token, cache on (s) | cache off (s) | off / on | same reply |');
console.log('|---|---|---|---|---|---|---|');
let same = true;
for (let t = 0; t < turns; t++) {
  const a = on[t], b = off[t];
  const identical = a.content === b.content && JSON.stringify(a.logprobs) === JSON.stringify(b.logprobs);
  same &&= identical;
  const cached = a.usage.prompt_tokens_details.cached_tokens;
  console.log(`| ${t + 1} | ${a.usage.prompt_tokens} | ${cached} (${(100 * cached / a.usage.prompt_tokens).toFixed(0)}%) | ` +
              `${a.ttft.toFixed(2)} | ${b.ttft.toFixed(2)} | ${(b.ttft / a.ttft).toFixed(1)}x | ${identical ? 'yes' : 'NO'} |`);
}
const sum = (rs) => rs.slice(1).reduce((s, r) => s + r.ttft, 0);
console.log(`\nturns 2-${turns}: ${sum(on).toFixed(1)} s to first tokens with the cache, ${sum(off).toFixed(1)} s without ` +
            `(${(sum(off) / sum(on)).toFixed(1)}x); replies ${same ? 'identical' : 'DIFFER'}`);
if (!same) process.exit(1);
