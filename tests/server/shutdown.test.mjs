// SIGTERM while requests run: a stream ends with an error event naming the shutdown and
// [DONE], a non-streamed request gets 503, new requests are refused, and the process exits 0.
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const server = await startServer(fixture('small-v2-Q4_K_M.gguf'), ['--ctx', '4096', '--parallel', '2']);
const long = { messages: [{ role: 'user', content: 'Go on.' }], max_tokens: 4000, ignore_eos: true, temperature: 0 };

const res = await fetch(server.base + '/v1/chat/completions', {
  method: 'POST', headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ ...long, stream: true, logprobs: true }) });
const reader = res.body.getReader(), decoder = new TextDecoder();
let streamed = '';
while (!streamed.includes('"logprobs":{"content"')) {  // the first token has arrived
  const { value, done } = await reader.read();
  if (done) break;
  streamed += decoder.decode(value, { stream: true });
}
const whole = postJson(server.base, '/v1/chat/completions', long);
await new Promise((r) => setTimeout(r, 200));  // the second request is running too
const stopped = server.stop();  // SIGTERM; checks exit code 0
for (;;) {
  const { value, done } = await reader.read();
  if (done) break;
  streamed += decoder.decode(value, { stream: true });
}
const tokens = (streamed.match(/"logprob":/g) || []).length;
check(tokens < 4000, 'the stream was still running when the server stopped', `${tokens} tokens`);
check(/data: \{"error":\{"message":"the server is shutting down"/.test(streamed),
      'the stream ends with an error event naming the shutdown', streamed.slice(-300));
check(streamed.trimEnd().endsWith('data: [DONE]'), 'the stream ends with [DONE]');
const answer = await whole;
check(answer.status === 503 && answer.json?.error?.message.includes('shutting down'),
      'a running non-streamed request gets 503', answer.text.slice(0, 200));
await stopped;
finish('shutdown');
