// Malformed and hostile requests: each gets the right 4xx in OpenAI's error shape, none disturbs
// a stream running at the same time, and the server answers a normal request afterwards.
import net from 'node:net';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--api-key', 'k', '--ctx', '128', '--timeout', '2', '--parallel', '2']);
const auth = { Authorization: 'Bearer k' };
const user = [{ role: 'user', content: 'hello' }];
const chat = (extra) => ({ messages: user, max_tokens: 4, ...extra });

// [name, route, body (object or raw string/Buffer), expected status, headers]
const cases = [
  ['not JSON', '/v1/chat/completions', '{"messages": [', 400],
  ['JSON array body', '/v1/chat/completions', '[1, 2]', 400],
  ['empty body', '/v1/chat/completions', '', 400],
  ['messages missing', '/v1/chat/completions', { max_tokens: 4 }, 400],
  ['messages not a list', '/v1/chat/completions', { messages: 'hello' }, 400],
  ['messages empty', '/v1/chat/completions', { messages: [] }, 400],
  ['message not an object', '/v1/chat/completions', { messages: ['hello'] }, 400],
  ['role missing', '/v1/chat/completions', { messages: [{ content: 'x' }] }, 400],
  ['unknown role', '/v1/chat/completions', { messages: [{ role: 'wizard', content: 'x' }] }, 400],
  ['content a number', '/v1/chat/completions', { messages: [{ role: 'user', content: 42 }] }, 400],
  ['image content part', '/v1/chat/completions',
   { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }, 400],
  ['text part without text', '/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'text' }] }] }, 400],
  ['negative max_tokens', '/v1/chat/completions', chat({ max_tokens: -1 }), 400],
  ['max_tokens a string', '/v1/chat/completions', chat({ max_tokens: '10' }), 400],
  ['max_tokens a fraction', '/v1/chat/completions', chat({ max_tokens: 2.5 }), 400],
  ['max_tokens past 64 bits', '/v1/chat/completions', '{"messages":[{"role":"user","content":"hi"}],"max_tokens":1e400}', 400],
  ['huge max_completion_tokens', '/v1/chat/completions',
   '{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":99999999999999999999999}', 400],
  ['temperature negative', '/v1/chat/completions', chat({ temperature: -1 }), 400],
  ['temperature huge', '/v1/chat/completions', chat({ temperature: 1e308 }), 400],
  ['temperature a string', '/v1/chat/completions', chat({ temperature: 'hot' }), 400],
  ['top_p zero', '/v1/chat/completions', chat({ top_p: 0 }), 400],
  ['top_k negative', '/v1/chat/completions', chat({ top_k: -5 }), 400],
  ['min_p above 1', '/v1/chat/completions', chat({ min_p: 1.5 }), 400],
  ['presence_penalty out of range', '/v1/chat/completions', chat({ presence_penalty: 3 }), 400],
  ['n above --parallel', '/v1/chat/completions', chat({ n: 3 }), 400],
  ['n = 0', '/v1/chat/completions', chat({ n: 0 }), 400],
  ['a tool without a name', '/v1/chat/completions',
   chat({ tools: [{ type: 'function', function: { parameters: { type: 'object' } } }] }), 400],
  ['stop a number', '/v1/chat/completions', chat({ stop: 5 }), 400],
  ['empty stop string', '/v1/chat/completions', chat({ stop: [''] }), 400],
  ['five stop strings', '/v1/chat/completions', chat({ stop: ['a', 'b', 'c', 'd', 'e'] }), 400],
  ['seed a string', '/v1/chat/completions', chat({ seed: 'abc' }), 400],
  ['stream a string', '/v1/chat/completions', chat({ stream: 'yes' }), 400],
  ['top_logprobs without logprobs', '/v1/chat/completions', chat({ top_logprobs: 3 }), 400],
  ['top_logprobs 50', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 }), 400],
  ['prompt longer than the context', '/v1/chat/completions',
   { messages: [{ role: 'user', content: 'word '.repeat(400) }] }, 400],
  ['invalid UTF-8', '/v1/chat/completions',
   Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]),
                  Buffer.from('"}]}')]), 400],
  ['10 MB body', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'a'.repeat(10 << 20) }] }), 413],
  ['completions prompt an object', '/v1/completions', { prompt: { text: 'x' } }, 400],
  ['completions token id outside the vocabulary', '/v1/completions', { prompt: [1, 2, 99999999] }, 400],
  ['completions logprobs 9', '/v1/completions', { prompt: 'x', logprobs: 9 }, 400],
  ['unknown endpoint', '/v1/embeddings', { input: 'x' }, 404],
  ['no API key', '/v1/chat/completions', chat({}), 401, {}],
  ['wrong API key', '/v1/chat/completions', chat({}), 401, { Authorization: 'Bearer nope' }],
];

async function send([name, route, body, expected, headers]) {
  const raw = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  const res = await fetch(server.base + route, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...(headers ?? auth) }, body: raw });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) {}
  check(res.status === expected, `${name}: status ${expected}`, `got ${res.status}: ${text.slice(0, 200)}`);
  check(json && json.error && typeof json.error.message === 'string' && json.error.type, `${name}: OpenAI error shape`,
        text.slice(0, 200));
  return json;
}

// A slow-loris client: opens a connection, sends part of a request, then goes quiet. The server
// must drop it after --timeout (2 s) without tying anything up.
function slowLoris(partial) {
  return new Promise((resolve) => {
    const socket = net.connect(server.port, '127.0.0.1', () => socket.write(partial));
    const started = Date.now();
    let received = '';
    socket.on('data', (d) => { received += d; });
    socket.on('close', () => resolve({ seconds: (Date.now() - started) / 1000, received }));
    socket.setTimeout(15000, () => { socket.destroy(); resolve({ seconds: 15, received, hung: true }); });
  });
}

try {
  // A stream runs through all of it and must finish normally.
  const background = fetch(server.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...auth },
    body: JSON.stringify({ messages: user, max_tokens: 100, stream: true, temperature: 0 }) }).then((r) => r.text());

  const lorises = [slowLoris('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le'),
                   slowLoris('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"mess')];
  const tooLong = await send(cases.find((c) => c[0] === 'prompt longer than the context'));
  check(tooLong && /\d+ tokens/.test(tooLong.error.message) && tooLong.error.message.includes('128'),
        'the too-long error names both lengths', tooLong?.error?.message);
  for (const c of cases) await send(c);
  for (const loris of await Promise.all(lorises))
    check(!loris.hung && loris.seconds < 10, 'a slow-loris connection is dropped after the timeout',
          JSON.stringify(loris));

  const streamed = await background;
  check(streamed.trimEnd().endsWith('data: [DONE]') && !streamed.includes('"error"'),
        'a stream running meanwhile finishes normally', streamed.slice(-300));

  // Unknown fields are ignored; the server still answers normally.
  const ok = await postJson(server.base, '/v1/chat/completions', chat({ frobnicate: true, user: 'x' }), auth);
  check(ok.status === 200 && ok.json?.choices?.[0]?.message, 'a normal request afterwards gets 200', ok.text);
  const health = await fetch(server.base + '/health');
  check(health.status === 200, 'health is ok afterwards');
  console.log(`${cases.length} malformed requests and 2 slow-loris connections sent`);
} finally {
  await server.stop();
}

// Beyond capacity: one slot, one waiting place; of six requests at once, the ones that find both
// taken get 429 with Retry-After, and the others finish normally.
const small = await startServer(model, ['--ctx', '256', '--parallel', '1', '--max-queue', '1']);
try {
  const flood = await Promise.all([...Array(6).keys()].map(() =>
    postJson(small.base, '/v1/chat/completions', { messages: user, max_tokens: 200, temperature: 0 })));
  const refused = flood.filter((r) => r.status === 429);
  check(refused.length >= 1, 'requests beyond the slots and the queue get 429', flood.map((r) => r.status).join(','));
  check(refused.every((r) => r.headers.get('retry-after') && r.json?.error?.type === 'rate_limit_error'),
        '429 carries Retry-After and a rate_limit_error');
  check(flood.filter((r) => r.status === 200).length >= 2 && flood.every((r) => [200, 429].includes(r.status)),
        'the admitted requests finish normally', flood.map((r) => r.status).join(','));
} finally {
  await small.stop();
}
finish('hostile requests');
