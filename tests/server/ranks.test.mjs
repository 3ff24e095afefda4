// `mpirun -np 2 tandem serve`: rank 0 serves, rank 1 holds half of the model. Greedy replies are
// the same as one process's, also from the prefix cache, for n = 2 choices and for concurrent
// requests whose decode steps overlap over a pipeline; a rank that hangs
// (SIGSTOP) or dies (SIGKILL) mid-stream ends the stream with an error event, not a hang.
import { readFileSync, readdirSync } from 'node:fs';
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const mpirun = process.env.MPIEXEC;
if (!mpirun) {
  console.error('MPIEXEC is not set: ctest passes the mpirun CMake found');
  process.exit(1);
}
const model = fixture('qwen3moe-micro-F32.gguf');
const ranks = ['--spread', 'mixed', '--rank-timeout', '3', '--threads', '1'];
const pipeline = ['--spread', 'pipeline', '--rank-timeout', '3', '--threads', '1'];
const launcher = [mpirun, '-np', '2'];

const chat = (content, extra = {}) => ({
  messages: [{ role: 'user', content }], max_tokens: 16, temperature: 0, ...extra,
});

async function sameRepliesAsOneProcess() {
  const one = await startServer(model, ['--threads', '1']);
  const two = await startServer(model, ranks, { launcher });
  const question = chat('Tell me about the sea and the ships on it.');
  const a = await postJson(one.base, '/v1/chat/completions', question);
  const b = await postJson(two.base, '/v1/chat/completions', question);
  check(b.status === 200, 'a completion over 2 ranks', b.text);
  check(a.json?.choices[0].message.content === b.json?.choices[0].message.content,
        'the same greedy reply over 2 ranks as in one process',
        `${a.json?.choices[0].message.content} / ${b.json?.choices[0].message.content}`);
  const again = await postJson(two.base, '/v1/chat/completions', question);
  check(again.json?.usage.prompt_tokens_details.cached_tokens > 0, 'the prefix cache serves over ranks',
        JSON.stringify(again.json?.usage));
  check(again.json?.choices[0].message.content === a.json?.choices[0].message.content,
        'the cached prompt gives the same reply');
  const choices = await postJson(two.base, '/v1/chat/completions', chat('Another one about rivers.', { n: 2 }));
  const single = await postJson(one.base, '/v1/chat/completions', chat('Another one about rivers.'));
  check(choices.json?.choices.length === 2 &&
        choices.json.choices.every((c) => c.message.content === single.json?.choices[0].message.content),
        'n = 2 choices over ranks (the prompt copied to the second) match one process',
        JSON.stringify(choices.json?.choices.map((c) => c.message.content)));
  // --spread mixed: every MoE layer's experts over both ranks, so both ranks' CPUs were chosen.
  const metrics = await (await fetch(two.base + '/metrics')).text();
  const chosen = (device) => Number(
    metrics.match(new RegExp(`tandem_expert_choices_total\\{device="${device}"\\} (\\d+)`))?.[1] ?? 0);
  check(chosen('cpu') > 0 && chosen('node1:cpu') > 0,
        '/metrics counts the expert choices of both ranks\' devices',
        metrics.split('\n').filter((l) => l.startsWith('tandem_expert_choices')).join('; '));
  await one.stop();
  two.child.kill('SIGTERM');
  await two.exited;
}

// --spread pipeline: rank 0's layers come first, so rank 0 starts one step (a group's decode, new
// prompts) while rank 1 computes another (Engine::start_batch). Concurrent requests of different
// lengths still get the replies one process gives each alone.
async function overlappedStepsGiveOneProcessReplies() {
  const one = await startServer(model, ['--threads', '1']);
  const two = await startServer(model, pipeline, { launcher });
  const questions = ['the sea', 'rivers', 'mountains at dawn', 'a long road'].map(
    (topic, i) => chat(`Tell me about ${topic}.`, { max_tokens: 200 - 40 * i }));
  const alone = [];
  for (const q of questions) alone.push(await postJson(one.base, '/v1/chat/completions', q));
  // The last one later, so that its prompt starts while the others' decode steps are in flight.
  const together = await Promise.all(questions.map((q, i) => new Promise(
    (done) => setTimeout(() => done(postJson(two.base, '/v1/chat/completions', q)), i === 3 ? 20 : 0))));
  questions.forEach((q, i) => {
    const a = alone[i].json?.choices[0].message.content, b = together[i].json?.choices[0].message.content;
    check(together[i].status === 200 && a === b,
          `request ${i} of 4 at once over a pipeline of 2 ranks: one process's reply`, `${a} / ${b}`);
  });
  const metrics = await (await fetch(two.base + '/metrics')).text();
  const overlapped = Number(metrics.match(/tandem_overlapped_steps_total (\d+)/)?.[1] ?? 0);
  check(overlapped > 0, 'steps overlapped over the pipeline', `${overlapped}`);
  await one.stop();
  two.child.kill('SIGTERM');
  await two.exited;
}

// Long streams; `signal` goes to rank 1 once tokens flow. Every stream must end with an error
// event, not hang or be cut: for a rank that hangs (SIGSTOP) rank 0's wait times out; for one that
// dies (SIGKILL) mpirun sends rank 0 SIGTERM and SIGKILL one second later, and rank 0 must end its
// streams with the error within that second (a receive from the dead rank once sat in MPI_Wait
// past it and the connection was cut). With several streams over a pipeline, their decode steps
// are in flight at once when the rank goes.
async function lostRankEndsTheStream(signal, eventRequired, { args = ranks, streams = 1 } = {}) {
  const server = await startServer(model, args, { launcher });
  const start = Date.now();
  const texts = new Array(streams).fill('');
  let signalled = false;
  const read = async (i) => {
    const res = await fetch(server.base + '/v1/chat/completions', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(chat(`Go on for a long time, ${i}.`, { max_tokens: 30000, stream: true })),
    });
    const decoder = new TextDecoder();
    try {
      for await (const chunk of res.body) {
        texts[i] += decoder.decode(chunk);
        if (!signalled && texts.every((t) => t.length > 2000)) {
          const pid = rankPidByParent(server.child.pid, 1);
          check(pid > 0, `rank 1's pid found (${signal})`);
          if (pid) process.kill(pid, signal);
          signalled = true;
        }
        if (Date.now() - start > 60000) break;
      }
    } catch (e) {
      check(!eventRequired, `stream ${i} after rank 1 got ${signal} ends with an event, not a cut connection`,
            `${e.message}; it ended: ${texts[i].slice(-300)}`);
      if (!eventRequired) console.log(`${signal}: the connection was cut (${e.message}) after ${Date.now() - start} ms`);
    }
  };
  await Promise.all(texts.map((_, i) => read(i)));
  check(Date.now() - start < 30000, `the streams end soon after rank 1 got ${signal}`);
  texts.forEach((text, i) => {
    const events = text.split('\n\n').filter((e) => e.startsWith('data: '));
    const last = events.filter((e) => e !== 'data: [DONE]').pop() || '';
    const errorEvent = /"error"/.test(last) && /rank 1|interrupted/.test(last);
    check(errorEvent || !eventRequired,
          `a ${signal}ed rank ends stream ${i} of ${streams} with an error event naming the cause`,
          last.slice(0, 300));
    if (errorEvent) console.log(`${signal}: stream ${i} ended with ${last.slice(0, 200)}`);
  });
  const ended = await Promise.race([server.exited.then(() => true),
                                    new Promise((r) => setTimeout(() => r(false), 15000))]);
  check(ended, `the run ends on its own after rank 1 got ${signal}`);
  if (!ended) server.child.kill('SIGKILL');
  for (const rank of [0, 1]) {
    const pid = rankPidByParent(server.child.pid, rank);
    if (pid) process.kill(pid, 'SIGKILL');
  }
}

// Ranks are children of mpirun; their command lines carry --port 0, so find them by parent.
function rankPidByParent(parent, rank) {
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (ppid !== parent) continue;
      const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      if (env.includes(`OMPI_COMM_WORLD_RANK=${rank}`)) return Number(pid);
    } catch (e) {}
  }
  return 0;
}

await sameRepliesAsOneProcess();
await overlappedStepsGiveOneProcessReplies();
await lostRankEndsTheStream('SIGSTOP', true);
await lostRankEndsTheStream('SIGKILL', true);
await lostRankEndsTheStream('SIGSTOP', true, { args: pipeline, streams: 3 });
finish('ranks');
