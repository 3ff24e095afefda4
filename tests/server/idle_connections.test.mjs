// Idle and slow clients do not hold others up: with 300 connections open that send nothing (and
// 20 that send half a request line), a normal request is answered within 1 s of its time alone.
// Also the header limit: a request whose headers pass --max-header-bytes gets 431 naming it.
import net from 'node:net';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--parallel', '2', '--ctx', '256', '--timeout', '20',
                                         '--max-header-bytes', '4096']);
const body = { messages: [{ role: 'user', content: 'Name a colour.' }], max_tokens: 8, seed: 3 };

async function timed() {
  const start = performance.now();
  const r = await postJson(server.base, '/v1/chat/completions', body);
  check(r.status === 200, 'the request is answered', r.text);
  return (performance.now() - start) / 1000;
}

function openIdle(port, partial) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1', () => {
      if (partial) socket.write(partial);
      resolve(socket);
    });
    socket.on('error', () => resolve(socket));
  });
}

const sockets = [];
try {
  await timed();  // warm-up
  const alone = Math.min(await timed(), await timed());
  for (let i = 0; i < 300; i++) sockets.push(await openIdle(server.port, ''));
  for (let i = 0; i < 20; i++) sockets.push(await openIdle(server.port, 'POST /v1/chat/comp'));
  await new Promise((r) => setTimeout(r, 300));  // the server has accepted them all
  const crowded = await timed();
  console.log(`alone ${alone.toFixed(3)} s, beside 320 idle connections ${crowded.toFixed(3)} s`);
  check(crowded <= alone + 1, 'a request beside 320 idle connections is answered within 1 s of its time alone',
        `${crowded.toFixed(3)} s vs ${alone.toFixed(3)} s`);
  const health = await fetch(server.base + '/health');
  check(health.status === 200, '/health answers beside them');

  const big = await postJson(server.base, '/v1/chat/completions', body, { 'X-Padding': 'x'.repeat(5000) });
  check(big.status === 431 && /max-header-bytes/.test(big.text), 'headers past --max-header-bytes get 431',
        `${big.status} ${big.text}`);
} finally {
  for (const s of sockets) s.destroy();
  await server.stop();
}
finish('idle_connections');
