// The chat side of each model family through `tandem serve`: POST /apply-template renders the
// fixtures' chat prompt byte for byte as each model's own template does (gpt-oss's date aside,
// which is today's), the chat endpoint tokenizes it to the fixture's prompt ids, and reasoning comes
// back apart from the answer (--reasoning-format auto) exactly as the inline reply
// (--reasoning-format none) splits: Harmony's analysis channel, R1's <think> block.
import { readFileSync } from 'node:fs';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const userMessage = 'Write a short poem about the sea, in English and 中文.';

for (const arch of ['qwen3moe', 'gpt-oss', 'glm4moe']) {
  const model = fixture(`${arch}-micro-F32.gguf`);
  const ref = JSON.parse(readFileSync(fixture(`${arch}-micro-F32.chat.json`), 'utf8'));
  const server = await startServer(model, ['--ctx', '512']);
  try {
    const messages = [{ role: 'user', content: userMessage }];
    const { status, json } = await postJson(server.base, '/apply-template', { messages });
    let prompt = json?.prompt ?? '';
    if (arch === 'gpt-oss') {
      const today = new Date().toISOString().slice(0, 10);
      check(prompt.includes(`Current date: ${today}\n`), 'gpt-oss: the system message has today\'s date', prompt);
      prompt = prompt.replace(/Current date: \d{4}-\d{2}-\d{2}/, 'Current date: 2025-08-05');
    }
    check(status === 200 && prompt === ref.prompt, `${arch}: /apply-template renders the fixture's chat prompt`,
          JSON.stringify(prompt));
    if (arch !== 'gpt-oss') {  // the date's digits aside, the ids are the reference's
      const chat = await postJson(server.base, '/v1/chat/completions', { messages, max_tokens: 1 });
      check(chat.json?.usage?.prompt_tokens === ref.prompt_tokens.length,
            `${arch}: the chat prompt is the fixture's ${ref.prompt_tokens.length} tokens`,
            JSON.stringify(chat.json?.usage));
    }
  } finally {
    await server.stop();
  }
}

// The same greedy reply with reasoning inline and split out.
function reference_split(format, text) {
  if (format === 'think') {  // the prompt opened <think>: reasoning up to </think>
    const end = text.indexOf('</think>');
    if (end < 0) return { reasoning: text.trim(), content: '' };
    return { reasoning: text.slice(0, end).trim(), content: text.slice(end + 8).replace(/^\s+/, '') };
  }
  // Harmony: the text must open with a channel header to be split at all.
  if (!text.startsWith('<|channel|>')) return { reasoning: '', content: text };
  let reasoning = '', content = '';
  for (const message of text.split('<|end|>')) {
    const m = message.match(/^(?:<\|start\|>assistant)?<\|channel\|>(\w+)[^]*?<\|message\|>([^]*)$/);
    if (!m) return { reasoning: '', content: text };
    if (m[1] === 'analysis') reasoning += m[2]; else content += m[2];
  }
  return { reasoning, content };
}

for (const [name, args, format] of [['micro-v3-F32.gguf', ['--chat-template', 'deepseek-r1'], 'think'],
                                    ['gpt-oss-micro-F32.gguf', [], 'harmony']]) {
  const replies = {};
  for (const mode of ['none', 'auto']) {
    const server = await startServer(fixture(name), ['--ctx', '512', '--reasoning-format', mode, ...args]);
    try {
      const body = { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 24, temperature: 0 };
      const whole = await postJson(server.base, '/v1/chat/completions', body);
      const message = whole.json?.choices?.[0]?.message ?? {};
      // Streamed: the deltas add up to the same two texts.
      const res = await fetch(server.base + '/v1/chat/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ ...body, stream: true }) });
      let streamed = { reasoning: '', content: '' };
      for (const line of (await res.text()).split('\n')) {
        if (!line.startsWith('data: {')) continue;
        const delta = JSON.parse(line.slice(6)).choices?.[0]?.delta ?? {};
        streamed.reasoning += delta.reasoning_content ?? '';
        streamed.content += delta.content ?? '';
      }
      replies[mode] = { reasoning: message.reasoning_content ?? '', content: message.content ?? '', streamed };
    } finally {
      await server.stop();
    }
  }
  const want = reference_split(format, replies.none.content);
  check(replies.none.reasoning === '', `${name}: --reasoning-format none keeps the reasoning inline`);
  check(replies.auto.reasoning === want.reasoning && replies.auto.content === want.content,
        `${name}: reasoning_content and content split the inline reply`,
        JSON.stringify({ inline: replies.none.content, got: replies.auto, want }));
  check(replies.auto.streamed.reasoning === want.reasoning && replies.auto.streamed.content === want.content,
        `${name}: streamed deltas add up to the same split`, JSON.stringify(replies.auto.streamed));
  if (format === 'think')
    check(want.reasoning.length > 0, `${name}: R1's reply starts inside its reasoning block`);
}

finish('model_families');
