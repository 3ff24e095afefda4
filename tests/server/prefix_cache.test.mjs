// The prefix cache through the API: a chat whose history grows turn by turn gets its history from
// the cache from the second turn on (usage.prompt_tokens_details.cached_tokens, /metrics), and
// every reply is the same, log-probabilities included, as from a server started with
// --no-prefix-cache. A streamed reply's usage chunk reports the cached tokens too.
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const document = Array.from({ length: 600 }, (_, i) => `item${(i * 37) % 101}`).join(' ');

async function conversation(extraArgs) {
  const server = await startServer(model, ['--parallel', '2', '--ctx', '4096', ...extraArgs]);
  const turns = [];
  let metrics = '';
  try {
    const messages = [{ role: 'system', content: 'Answer from the document.' },
                      { role: 'user', content: `Document: ${document}\nWhat is the first item?` }];
    for (let turn = 0; turn < 4; turn++) {
      const r = await postJson(server.base, '/v1/chat/completions',
                               { messages, max_tokens: 12, temperature: 0.8, seed: 100 + turn, logprobs: true,
                                 ignore_eos: true });
      check(r.status === 200, `turn ${turn} answered`, r.text);
      const choice = r.json.choices[0];
      turns.push({ content: choice.message.content, logprobs: choice.logprobs.content.map((t) => t.logprob),
                   usage: r.json.usage });
      messages.push({ role: 'assistant', content: choice.message.content },
                    { role: 'user', content: `Turn ${turn}: and the next one?` });
    }
    // Streamed, with the usage chunk.
    const res = await fetch(server.base + '/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ messages, max_tokens: 4, seed: 1, stream: true, stream_options: { include_usage: true } }),
    });
    const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
    turns.push({ usage: JSON.parse(events.at(-1).slice(6)).usage });
    metrics = await (await fetch(server.base + '/metrics')).text();
  } finally {
    await server.stop();
  }
  return { turns, metrics };
}

const cached = await conversation([]);
const evaluated = await conversation(['--no-prefix-cache']);

let hits = 0;
for (let turn = 0; turn < cached.turns.length; turn++) {
  const a = cached.turns[turn], b = evaluated.turns[turn];
  const { prompt_tokens: prompt, prompt_tokens_details: details } = a.usage;
  check(details && Number.isInteger(details.cached_tokens), `turn ${turn}: usage.prompt_tokens_details.cached_tokens`,
        JSON.stringify(a.usage));
  check(b.usage.prompt_tokens_details.cached_tokens === 0, `turn ${turn}: nothing cached with --no-prefix-cache`,
        JSON.stringify(b.usage));
  if (turn === 0) check(details.cached_tokens === 0, 'the first turn finds nothing cached', JSON.stringify(a.usage));
  else
    check(details.cached_tokens >= 0.9 * prompt, `turn ${turn}: at least 90% of the prompt comes from the cache`,
          `${details.cached_tokens} of ${prompt}`);
  console.log(`turn ${turn}: ${details.cached_tokens} of ${prompt} prompt tokens from the cache`);
  hits += details.cached_tokens;
  if (a.content === undefined) continue;  // the streamed request
  check(a.content === b.content, `turn ${turn}: the same reply with the cache as without`,
        `${JSON.stringify(a.content)} vs ${JSON.stringify(b.content)}`);
  check(JSON.stringify(a.logprobs) === JSON.stringify(b.logprobs), `turn ${turn}: the same log-probabilities`);
}
const metric = (text, name) => Number((text.match(new RegExp(`^tandem_${name} (\\S+)$`, 'm')) || [])[1]);
check(metric(cached.metrics, 'prefix_cache_hit_tokens_total') === hits,
      '/metrics counts the cached prompt tokens', `${metric(cached.metrics, 'prefix_cache_hit_tokens_total')} vs ${hits}`);
check(metric(cached.metrics, 'prefix_cache_bytes') > 0, '/metrics shows the cache holding rows');
check(metric(evaluated.metrics, 'prefix_cache_budget_bytes') === 0, '--no-prefix-cache leaves no budget');
finish('prefix_cache');
