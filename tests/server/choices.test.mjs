// `n` choices through the official `openai` client: three choices, each the same as a solo request
// with seed + its index, whole and streamed (deltas reassembled by index); more choices than the
// server's --parallel get a 400 naming `n`.
import OpenAI from 'openai';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--parallel', '4', '--ctx', '256', '--model-alias', 'tiny']);
const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0 });
const request = { model: 'tiny', messages: [{ role: 'user', content: 'Name three colours.' }], max_tokens: 12,
                  temperature: 0.9, ignore_eos: true, logprobs: true };

try {
  const solo = [];
  for (let i = 0; i < 3; i++) solo.push((await client.chat.completions.create({ ...request, seed: 40 + i })).choices[0]);

  const three = await client.chat.completions.create({ ...request, seed: 40, n: 3 });
  check(three.choices.length === 3, 'n: 3 gives three choices', JSON.stringify(three.choices.length));
  three.choices.forEach((c, i) => {
    check(c.index === i, `choice ${i} has index ${i}`, String(c.index));
    check(c.message.content === solo[i].message.content, `choice ${i} is the solo request with seed 40 + ${i}`,
          `${JSON.stringify(c.message.content)} vs ${JSON.stringify(solo[i].message.content)}`);
    check(JSON.stringify(c.logprobs.content.map((t) => t.logprob)) ===
          JSON.stringify(solo[i].logprobs.content.map((t) => t.logprob)), `choice ${i}: the same log-probabilities`);
  });
  check(new Set(three.choices.map((c) => c.message.content)).size > 1, 'the choices differ from each other');
  check(three.usage.completion_tokens === 36, 'usage counts every choice\'s tokens', String(three.usage.completion_tokens));

  const stream = await client.chat.completions.create({ ...request, seed: 40, n: 3, stream: true });
  const streamed = ['', '', ''], finishes = [null, null, null];
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      if (c.delta.content) streamed[c.index] += c.delta.content;
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  streamed.forEach((text, i) => check(text === solo[i].message.content, `streamed choice ${i} is the solo request`,
                                      `${JSON.stringify(text)} vs ${JSON.stringify(solo[i].message.content)}`));
  check(finishes.every((f) => f === 'length'), 'every streamed choice ends with its finish_reason', JSON.stringify(finishes));

  const tooMany = await postJson(server.base, '/v1/chat/completions', { ...request, n: 5 });
  check(tooMany.status === 400 && /\bn\b/.test(tooMany.json?.error?.message || ''),
        'n above --parallel gets a 400 naming n', tooMany.text);
} finally {
  await server.stop();
}
finish('choices');
