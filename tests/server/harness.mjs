// Shared by the server tests: starts `tandem serve` on a free port with a fixture model, waits
// until GET /health says ok, and stops it with SIGTERM (checking that it exits 0). Also a tiny
// check() that counts failures so a script reports every problem, not just the first.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';

export const repoRoot = path.resolve(import.meta.dirname, '../..');
export const fixtures = path.resolve(repoRoot, '../shared/fixtures');

let failures = 0;
export function check(ok, what, detail = '') {
  if (ok) return true;
  failures++;
  console.error(`FAIL: ${what}${detail ? ': ' + detail : ''}`);
  return false;
}
export function finish(name) {
  if (failures) {
    console.error(`${name}: ${failures} check(s) failed`);
    process.exit(1);
  }
  console.log(`${name}: all checks passed`);
}

export function fixture(name) {
  const file = path.join(fixtures, name);
  if (!existsSync(file)) {
    console.error(`fixture ${file} is missing: the tests read ../shared/fixtures beside the repository`);
    process.exit(1);
  }
  return file;
}

// The tandem binary under test: TANDEM_BIN (ctest passes the build's), else the release build.
export const tandemBin = process.env.TANDEM_BIN || path.join(repoRoot, 'build/release/bin/tandem');

export function tokenCount(model, text, { special = false, bos = true } = {}) {
  const args = ['tokenize', model, text, '--json'];
  if (special) args.push('--special');
  if (!bos) args.push('--no-bos');
  return JSON.parse(execFileSync(tandemBin, args, { encoding: 'utf8' })).tokens.length;
}

// `launcher`: a command that starts tandem, e.g. ['mpirun', '-np', '2'] for a run over ranks.
export async function startServer(model, extraArgs = [], { launcher = [] } = {}) {
  const threads = extraArgs.includes('--threads') ? [] : ['--threads', '2'];
  const args = ['serve', model, '--port', '0', ...threads, ...extraArgs];
  const child = launcher.length
      ? spawn(launcher[0], [...launcher.slice(1), tandemBin, ...args], { stdio: ['ignore', 'inherit', 'pipe'] })
      : spawn(tandemBin, args, { stdio: ['ignore', 'inherit', 'pipe'] });
  let stderr = '';
  const port = await new Promise((resolve, reject) => {
    child.stderr.on('data', (chunk) => {
      stderr += chunk;
      process.stderr.write(chunk);
      const m = stderr.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    child.on('exit', (code) => reject(new Error(`tandem serve exited with ${code} before listening:\n${stderr}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try {
      if ((await fetch(base + '/health')).status === 200) break;
    } catch (e) {}
    if (i > 600) throw new Error('the server did not become ready in 60 s');
    await new Promise((r) => setTimeout(r, 100));
  }
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    port, base, child, exited,
    async stop() {
      child.kill('SIGTERM');
      const { code, signal } = await exited;
      check(code === 0, 'tandem serve exits 0 on SIGTERM', `code ${code}, signal ${signal}`);
    },
  };
}

export async function postJson(base, route, body, headers = {}) {
  const res = await fetch(base + route, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch (e) {}
  return { status: res.status, json, text, headers: res.headers };
}
