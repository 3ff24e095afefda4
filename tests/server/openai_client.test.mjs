// The official `openai` npm client against `tandem serve`: chat and completions, streamed and
// not, usage equal to the tokenizer's counts, stop sequences, the model list, and the API key.
import OpenAI from 'openai';
import { check, finish, fixture, startServer, tokenCount } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--api-key', 'test-key', '--model-alias', 'tiny', '--parallel', '2',
                                         '--ctx', '256']);
const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'test-key', maxRetries: 0 });

try {
  // Models.
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'tiny', 'models.list names the alias',
        JSON.stringify(models.data));

  // Chat, not streamed. The fixture has DeepSeek-V3's template: BOS, system, "<｜User｜>U<｜Assistant｜>".
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a colour.' }];
  const chat = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 16, seed: 7,
                                                      temperature: 0.8, logprobs: true, top_logprobs: 2 });
  const choice = chat.choices[0];
  check(chat.object === 'chat.completion', 'chat object', chat.object);
  check(typeof choice.message.content === 'string' && choice.message.role === 'assistant', 'chat message');
  check(['stop', 'length'].includes(choice.finish_reason), 'chat finish_reason', choice.finish_reason);
  const bos = '<｜begin▁of▁sentence｜>';
  const rendered = `${bos}Be brief.<｜User｜>Name a colour.<｜Assistant｜>`;
  check(chat.usage.prompt_tokens === tokenCount(model, rendered, { special: true, bos: false }),
        'chat usage.prompt_tokens equals the tokenizer count of the templated prompt',
        `${chat.usage.prompt_tokens} vs ${tokenCount(model, rendered, { special: true, bos: false })}`);
  check(chat.usage.completion_tokens === choice.logprobs.content.length + (choice.finish_reason === 'stop' ? 1 : 0),
        'chat usage.completion_tokens counts every generated token',
        `${chat.usage.completion_tokens} vs ${choice.logprobs.content.length} logprobs`);
  check(chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, 'total_tokens');
  check(choice.logprobs.content.every((t) => t.top_logprobs.length === 2 && t.logprob <= 0), 'chat logprobs shape');

  // Chat, streamed, same seed: the same text, then a usage chunk.
  const stream = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 16, seed: 7,
                                                        temperature: 0.8, stream: true,
                                                        stream_options: { include_usage: true } });
  let streamed = '', finishReason = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.delta?.content ?? '';
      if (c.finish_reason) finishReason = c.finish_reason;
    }
  }
  check(streamed === choice.message.content, 'streamed chat text equals the non-streamed one (same seed)',
        JSON.stringify([streamed, choice.message.content]));
  check(finishReason === choice.finish_reason, 'streamed finish_reason', finishReason);
  check(usage && usage.prompt_tokens === chat.usage.prompt_tokens &&
        usage.completion_tokens === chat.usage.completion_tokens, 'streamed usage chunk', JSON.stringify(usage));
  check(chunks >= 3, 'a stream has a role chunk, content and a final chunk', String(chunks));

  // Content as a list of text parts gives the same prompt.
  const parts = await client.chat.completions.create({
    model: 'tiny', max_tokens: 16, seed: 7, temperature: 0.8,
    messages: [{ role: 'system', content: [{ type: 'text', text: 'Be ' }, { type: 'text', text: 'brief.' }] },
               { role: 'user', content: [{ type: 'text', text: 'Name a colour.' }] }] });
  check(parts.choices[0].message.content === choice.message.content, 'content parts equal the string content');

  // Completions, not streamed and streamed.
  const prompt = 'The quick brown fox';
  const completion = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0 });
  check(completion.object === 'text_completion', 'completion object', completion.object);
  check(completion.usage.prompt_tokens === tokenCount(model, prompt), 'completion usage.prompt_tokens',
        `${completion.usage.prompt_tokens} vs ${tokenCount(model, prompt)}`);
  const completionStream = await client.completions.create({ model: 'tiny', prompt, max_tokens: 8, temperature: 0,
                                                             stream: true });
  let completionText = '';
  for await (const chunk of completionStream) completionText += chunk.choices[0]?.text ?? '';
  check(completionText === completion.choices[0].text, 'streamed completion equals the non-streamed one',
        JSON.stringify([completionText, completion.choices[0].text]));

  // Stop sequences: the output ends before the first one, with finish_reason "stop".
  const free = await client.completions.create({ model: 'tiny', prompt, max_tokens: 24, temperature: 0 });
  const text = free.choices[0].text;
  if (check(text.length >= 6, 'a long enough free run to cut', JSON.stringify(text))) {
    const stop = text.slice(3, 5);
    for (const stopParam of [stop, [stop, 'zzzz-not-there']]) {
      const cut = await client.completions.create({ model: 'tiny', prompt, max_tokens: 24, temperature: 0,
                                                    stop: stopParam });
      check(cut.choices[0].finish_reason === 'stop', 'stop sequence ends with finish_reason stop');
      check(cut.choices[0].text === text.slice(0, text.indexOf(stop)), 'text ends before the stop sequence',
            JSON.stringify([cut.choices[0].text, text, stop]));
    }
    const cutStream = await client.completions.create({ model: 'tiny', prompt, max_tokens: 24, temperature: 0,
                                                        stop: stop, stream: true });
    let cutText = '';
    for await (const chunk of cutStream) cutText += chunk.choices[0]?.text ?? '';
    check(cutText === text.slice(0, text.indexOf(stop)), 'streamed text ends before the stop sequence');
  }

  // max_tokens: "length" after exactly that many tokens.
  const short = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3, temperature: 0,
                                                       logprobs: true });
  if (short.choices[0].finish_reason === 'length')
    check(short.usage.completion_tokens === 3, 'max_tokens 3 gives 3 tokens', String(short.usage.completion_tokens));

  // A wrong key is refused with 401.
  const intruder = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
  try {
    await intruder.chat.completions.create({ model: 'tiny', messages, max_tokens: 2 });
    check(false, 'a wrong API key is refused');
  } catch (e) {
    check(e.status === 401, 'a wrong API key gets 401', String(e.status));
  }
} finally {
  await server.stop();
}
finish('openai client');
