// Tool calls through the official `openai` client against a DeepSeek-V3-template fixture with
// random weights: tool_choice "required" and a named tool always give a call whose arguments
// parse and follow the tool's parameters (whole and streamed); a round trip with the call and its
// result sent back is answered; "auto" answers; malformed tools and tool choices get a 400 naming
// the field; Qwen3's, R1's, V3.1's and GLM-4.5's syntax the same way; a template without tool
// calls in tandem refuses tools rather than ignoring them.
import OpenAI from 'openai';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city now',
    parameters: { type: 'object', properties: { city: { type: 'string', minLength: 1, maxLength: 16 },
                                                unit: { enum: ['c', 'f'] } },
                  required: ['city'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {
    zone: { type: 'string', maxLength: 8 } } } } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function argumentsFollow(call) {
  let args;
  try { args = JSON.parse(call.function.arguments); } catch (e) { return `arguments do not parse: ${call.function.arguments}`; }
  if (call.function.name === 'get_weather') {
    if (typeof args.city !== 'string' || args.city.length < 1) return `no city: ${call.function.arguments}`;
    if ('unit' in args && !['c', 'f'].includes(args.unit)) return `bad unit: ${call.function.arguments}`;
    if (Object.keys(args).some((k) => k !== 'city' && k !== 'unit')) return `extra key: ${call.function.arguments}`;
    return '';
  }
  if (call.function.name === 'get_time')
    return Object.keys(args).every((k) => k === 'zone') ? '' : `extra key: ${call.function.arguments}`;
  return `unknown tool ${call.function.name}`;
}

const server = await startServer(fixture('small-v2-Q4_K_M.gguf'), ['--parallel', '2', '--ctx', '2048',
                                                                     '--model-alias', 'tiny']);
const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0 });
try {
  for (let seed = 0; seed < 6; seed++) {
    const r = await client.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
                                                     max_tokens: 300, temperature: 1.0, seed });
    const choice = r.choices[0];
    check(choice.finish_reason === 'tool_calls', `required (seed ${seed}): finish_reason tool_calls`, choice.finish_reason);
    const calls = choice.message.tool_calls || [];
    if (!check(calls.length === 1, `required (seed ${seed}): one call`, JSON.stringify(choice.message))) continue;
    const why = argumentsFollow(calls[0]);
    check(!why, `required (seed ${seed}): the arguments follow the tool's parameters`, why);
    check(/^call_/.test(calls[0].id) && calls[0].type === 'function', `required (seed ${seed}): id and type`,
          JSON.stringify(calls[0]));
    check(choice.message.content === null, `required (seed ${seed}): content is null`, choice.message.content);
  }

  const named = await client.chat.completions.create({
    model: 'tiny', messages, tools, max_tokens: 300, seed: 1,
    tool_choice: { type: 'function', function: { name: 'get_time' } } });
  const namedCall = named.choices[0].message.tool_calls?.[0];
  check(namedCall?.function.name === 'get_time' && !argumentsFollow(namedCall), 'a named tool_choice calls that tool',
        JSON.stringify(named.choices[0].message));

  // Streamed: the call comes as a tool_calls delta, then finish_reason tool_calls.
  const stream = await client.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
                                                        max_tokens: 300, seed: 2, stream: true });
  const streamed = [];
  let finishReason = null;
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      for (const d of c.delta.tool_calls || []) {
        streamed[d.index] ??= { id: d.id, type: d.type, function: { name: '', arguments: '' } };
        streamed[d.index].function.name += d.function?.name || '';
        streamed[d.index].function.arguments += d.function?.arguments || '';
      }
      if (c.finish_reason) finishReason = c.finish_reason;
    }
  check(streamed.length === 1 && !argumentsFollow(streamed[0]), 'a streamed required call follows its tool',
        JSON.stringify(streamed));
  check(finishReason === 'tool_calls', 'a streamed call ends with finish_reason tool_calls', finishReason);
  const same = await client.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
                                                      max_tokens: 300, seed: 2 });
  const calls = (list) => JSON.stringify(list.map((c) => [c.function.name, c.function.arguments]));
  check(calls(same.choices[0].message.tool_calls) === calls(streamed), 'streamed and whole give the same call',
        `${calls(same.choices[0].message.tool_calls)} vs ${calls(streamed)}`);

  // The round trip: the call and its result go back, the model answers.
  const call = same.choices[0].message.tool_calls[0];
  const answer = await client.chat.completions.create({
    model: 'tiny', tools, max_tokens: 8, seed: 3,
    messages: [...messages, same.choices[0].message,
               { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' }] });
  check(['stop', 'length', 'tool_calls'].includes(answer.choices[0].finish_reason), 'the tool result is answered',
        JSON.stringify(answer.choices[0]));

  const auto = await client.chat.completions.create({ model: 'tiny', messages, tools, max_tokens: 8, seed: 4 });
  check(['stop', 'length', 'tool_calls'].includes(auto.choices[0].finish_reason), 'tool_choice auto answers');

  const bad = [
    [{ tools: [{ type: 'function', function: { description: 'x' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
       properties: { x: { type: 'string', pattern: 'a+' } } } } }] }, 'tools[0].function.parameters.properties.x.pattern'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'string' } } }] },
     'tools[0].function.parameters'],
    [{ tools: [{ type: 'retrieval' }] }, 'tools[0]'],
    [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tools, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools, messages: [...messages, { role: 'assistant', content: null, tool_calls: [{ type: 'function',
       function: { name: 'f', arguments: { a: 1 } } }] }] }, 'messages[1].tool_calls[0].function.arguments'],
  ];
  for (const [extra, param] of bad) {
    const r = await postJson(server.base, '/v1/chat/completions', { messages, max_tokens: 4, ...extra });
    check(r.status === 400 && r.json?.error?.param === param, `400 naming ${param}`, `${r.status} ${r.text}`);
  }
} finally {
  await server.stop();
}

// Qwen3's template lists the tools itself and takes calls in <tool_call> tags: a required call
// from random weights parses and follows its tool, and comes back as tool_calls.
const qwen = await startServer(fixture('qwen3moe-micro-F32.gguf'), ['--ctx', '1024']);
try {
  for (let seed = 0; seed < 3; seed++) {
    // Thinking on (the template's default) and off: a required call is the answer either way.
    const r = await postJson(qwen.base, '/v1/chat/completions',
                             { messages, tools, tool_choice: 'required', max_tokens: 200, seed,
                               chat_template_kwargs: { enable_thinking: seed === 0 } });
    const calls = r.json?.choices?.[0]?.message?.tool_calls || [];
    check(r.status === 200 && calls.length === 1 && !argumentsFollow(calls[0]) &&
          r.json.choices[0].finish_reason === 'tool_calls',
          `Qwen3 required (seed ${seed}): a call that follows its tool`, r.text);
  }
  const prompt = await postJson(qwen.base, '/apply-template', { messages, tools });
  check(prompt.status === 200 && prompt.json.prompt.includes('<tools>\n{"type": "function", "function": {"name": "get_weather"'),
        'Qwen3: the template lists the tools in the order the client sent their keys', prompt.text);
} finally {
  await qwen.stop();
}

// R1 writes calls as V3 does and V3.1 in its own syntax: a required call from random weights parses
// and follows its tool; a round trip renders; the tools' description follows the system prompt.
for (const template of ['deepseek-r1', 'deepseek-v3.1']) {
  const ds = await startServer(fixture('micro-v3-F32.gguf'), ['--ctx', '1024', '--chat-template', template]);
  try {
    const withSystem = [{ role: 'system', content: 'Be brief.' }, ...messages];
    for (let seed = 0; seed < 3; seed++) {
      const r = await postJson(ds.base, '/v1/chat/completions',
                               { messages: withSystem, tools, tool_choice: 'required', max_tokens: 200, seed });
      const calls = r.json?.choices?.[0]?.message?.tool_calls || [];
      check(r.status === 200 && calls.length === 1 && !argumentsFollow(calls[0]) &&
            r.json.choices[0].finish_reason === 'tool_calls',
            `${template} required (seed ${seed}): a call that follows its tool`, r.text);
      if (seed > 0 || !calls.length) continue;
      const answer = await postJson(ds.base, '/v1/chat/completions', {
        tools, max_tokens: 4, seed,
        messages: [...withSystem, r.json.choices[0].message,
                   { role: 'tool', tool_call_id: calls[0].id, content: '{"temperature": 21}' }] });
      check(answer.status === 200, `${template}: the tool result is answered`, answer.text);
      // No reasoning block is open after a result (the template adds no "<think>" there): the
      // answer is content, not reasoning.
      check(!answer.json?.choices?.[0]?.message?.reasoning_content,
            `${template}: the answer after a tool result is not taken for reasoning`, answer.text);
    }
    const prompt = await postJson(ds.base, '/apply-template', { messages: withSystem, tools });
    check(prompt.status === 200 && /^<｜begin▁of▁sentence｜>Be brief\.\n\n/.test(prompt.json.prompt) &&
          prompt.json.prompt.includes('get_weather'),
          `${template}: the tools are described after the system prompt`, prompt.text);
    if (template === 'deepseek-v3.1')
      check(prompt.json?.prompt.includes('Parameters: {"type": "object", "properties": {"city": {"type": "string", '),
            'deepseek-v3.1: parameters as json.dumps writes them, keys in the client\'s order', prompt.text);
  } finally {
    await ds.stop();
  }
}

// GLM-4.5 lists the tools itself and takes calls as key/value tags with strings raw: a required call
// from random weights parses back with arguments that follow the tool (the city a string however
// it reads), streamed the same as whole.
const glm = await startServer(fixture('glm4moe-micro-F32.gguf'), ['--ctx', '1024']);
try {
  for (let seed = 0; seed < 3; seed++) {
    const r = await postJson(glm.base, '/v1/chat/completions',
                             { messages, tools, tool_choice: 'required', max_tokens: 200, seed });
    const calls = r.json?.choices?.[0]?.message?.tool_calls || [];
    check(r.status === 200 && calls.length === 1 && !argumentsFollow(calls[0]) &&
          r.json.choices[0].finish_reason === 'tool_calls',
          `GLM-4.5 required (seed ${seed}): a call that follows its tool`, r.text);
  }
  const prompt = await postJson(glm.base, '/apply-template', {
    messages: [...messages, { role: 'assistant', content: null, tool_calls: [
      { id: 'a', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 2}' } }] },
               { role: 'tool', tool_call_id: 'a', content: 'sunny' }], tools });
  check(prompt.status === 200 && prompt.json.prompt.includes(
    '<think></think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n' +
    '<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>\n<tool_response>\nsunny'),
        'GLM-4.5: a call and its result render as its template writes them', prompt.text);
} finally {
  await glm.stop();
}

// A template whose tool syntax tandem does not have yet: tools are refused, not ignored.
const harmony = await startServer(fixture('gpt-oss-micro-F32.gguf'), ['--ctx', '256']);
try {
  const r = await postJson(harmony.base, '/v1/chat/completions', { messages, tools, max_tokens: 4 });
  check(r.status === 400 && r.json?.error?.param === 'tools' && /not have tool calls/.test(r.text),
        'tools on a template without tool calls in tandem: 400 naming tools', r.text);
  const none = await postJson(harmony.base, '/v1/chat/completions', { messages, tools, tool_choice: 'none', max_tokens: 4 });
  check(none.status === 200, 'tool_choice none is served anywhere', none.text);
  const result = await postJson(harmony.base, '/v1/chat/completions',
                                { messages: [...messages, { role: 'tool', content: 'x' }], max_tokens: 4 });
  check(result.status === 400 && result.json?.error?.param === 'messages[1].role', 'a tool result there: 400',
        result.text);
} finally {
  await harmony.stop();
}
finish('tool_calls');
