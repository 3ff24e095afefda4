// Batch invariance end to end: eight streaming clients with different prompts and seeds, all at
// once, each receive exactly the tokens (and log-probabilities, to the last bit of their JSON)
// they receive when they run alone.
import { check, finish, fixture, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--parallel', '8', '--ctx', '192']);

function body(i) {
  return {
    messages: [{ role: 'user', content: `Client ${i} asks: ` + 'why? '.repeat(i + 1) }],
    max_tokens: 32, stream: true, seed: 1000 + i, temperature: i % 3 === 0 ? 0 : 0.9, top_k: 40,
    logprobs: true, top_logprobs: 1,
  };
}

// The stream's text and its tokens' log-probabilities, as the raw JSON numbers.
async function run(i) {
  const res = await fetch(server.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body(i)) });
  if (res.status !== 200) throw new Error(`client ${i}: status ${res.status}: ${await res.text()}`);
  const raw = await res.text();
  let text = '', finishReason = null;
  const logprobs = [];
  for (const event of raw.split('\n\n')) {
    if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
    const chunk = JSON.parse(event.slice(6));
    const c = chunk.choices[0];
    text += c.delta.content ?? '';
    if (c.finish_reason) finishReason = c.finish_reason;
    for (const t of c.logprobs?.content ?? []) logprobs.push(t.logprob);
  }
  check(raw.trimEnd().endsWith('data: [DONE]'), `client ${i}: the stream ends with [DONE]`);
  return { text, finishReason, logprobs };
}

try {
  const alone = [];
  for (let i = 0; i < 8; i++) alone.push(await run(i));
  const together = await Promise.all([...Array(8).keys()].map((i) => run(i)));
  for (let i = 0; i < 8; i++) {
    check(alone[i].logprobs.length > 0, `client ${i}: tokens generated`);
    check(together[i].text === alone[i].text, `client ${i}: same text alone and among seven others`,
          JSON.stringify([alone[i].text, together[i].text]));
    check(JSON.stringify(together[i].logprobs) === JSON.stringify(alone[i].logprobs),
          `client ${i}: same token log-probabilities alone and batched`);
    check(together[i].finishReason === alone[i].finishReason, `client ${i}: same finish_reason`);
  }
  // The batch really ran together: the server saw decode steps with several sequences.
  const metrics = await (await fetch(server.base + '/metrics')).text();
  check(/tandem_generated_tokens_total \d+/.test(metrics), 'metrics count generated tokens');
} finally {
  await server.stop();
}
finish('concurrent streams');
