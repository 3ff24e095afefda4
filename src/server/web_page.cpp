#include "server/web_page.h"

namespace tandem::server {

std::string_view web_page_html() {
  // Streams /v1/chat/completions with fetch() and reads the SSE lines itself, so the stop button
  // is an AbortController: the server sees the connection close and frees the sequence.
  static constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tandem</title>
<style>
  :root { --bg: #f6f7f9; --panel: #fff; --line: #d9dde3; --text: #1d2330; --muted: #687083; --accent: #2f6fde; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, sans-serif; background: var(--bg); color: var(--text);
         display: grid; grid-template-columns: 1fr 280px; height: 100vh; }
  main { display: flex; flex-direction: column; min-height: 0; }
  #log { flex: 1; overflow-y: auto; padding: 16px 24px; }
  .msg { max-width: 820px; margin: 0 0 12px; padding: 10px 14px; border-radius: 8px; white-space: pre-wrap; }
  .user { background: #e3ecfb; margin-left: auto; }
  .assistant { background: var(--panel); border: 1px solid var(--line); }
  .error { background: #fdecec; border: 1px solid #f3b5b5; }
  form { display: flex; gap: 8px; padding: 12px 24px; border-top: 1px solid var(--line); background: var(--panel); }
  textarea { flex: 1; resize: none; height: 64px; padding: 8px; font: inherit; border: 1px solid var(--line); border-radius: 6px; }
  button { padding: 0 18px; font: inherit; border: 0; border-radius: 6px; background: var(--accent); color: #fff; cursor: pointer; }
  button#stop { background: #c2453d; }
  button:disabled { opacity: .4; cursor: default; }
  aside { border-left: 1px solid var(--line); background: var(--panel); padding: 16px; overflow-y: auto; }
  aside h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .05em; color: var(--muted); margin: 18px 0 8px; }
  label { display: flex; justify-content: space-between; align-items: center; margin: 6px 0; font-size: 14px; }
  label input { width: 96px; padding: 3px 6px; border: 1px solid var(--line); border-radius: 4px; }
  #system { width: 100%; height: 60px; font: inherit; font-size: 13px; }
  .stat { display: flex; justify-content: space-between; font-size: 14px; margin: 4px 0; }
  .stat span:last-child { font-variant-numeric: tabular-nums; }
  #placement { font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; color: var(--muted); }
</style>
</head>
<body>
<main>
  <div id="log"></div>
  <form id="form">
    <textarea id="input" placeholder="Message (Enter to send, Shift+Enter for a new line)"></textarea>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
  </form>
</main>
<aside>
  <h2>Sampling</h2>
  <label>temperature <input id="temperature" type="number" value="0.7" min="0" max="2" step="0.1"></label>
  <label>top_p <input id="top_p" type="number" value="0.95" min="0.01" max="1" step="0.05"></label>
  <label>max_tokens <input id="max_tokens" type="number" value="256" min="1" step="1"></label>
  <label>seed <input id="seed" type="number" placeholder="random"></label>
  <label>API key <input id="api_key" type="password" placeholder="if required"></label>
  <h2>System prompt</h2>
  <textarea id="system" placeholder="optional"></textarea>
  <h2>Live</h2>
  <div class="stat"><span>this reply</span><span id="reply_tps">–</span></div>
  <div class="stat"><span>server decode</span><span id="server_tps">–</span></div>
  <div class="stat"><span>running / queued</span><span id="load">–</span></div>
  <div class="stat"><span>model</span><span id="model">–</span></div>
  <h2>Placement</h2>
  <div id="placement">–</div>
</aside>
<script>
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

function add(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  div.textContent = text;
  $('log').appendChild(div);
  $('log').scrollTop = $('log').scrollHeight;
  return div;
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if ($('api_key').value) h['Authorization'] = 'Bearer ' + $('api_key').value;
  return h;
}

async function send(text) {
  history.push({ role: 'user', content: text });
  add('user', text);
  const out = add('assistant', '');
  const messages = $('system').value ? [{ role: 'system', content: $('system').value }, ...history] : history;
  const body = { messages, stream: true, stream_options: { include_usage: true },
                 temperature: +$('temperature').value, top_p: +$('top_p').value, max_tokens: +$('max_tokens').value };
  if ($('seed').value !== '') body.seed = +$('seed').value;
  controller = new AbortController();
  $('send').disabled = true; $('stop').disabled = false;
  let reply = '', tokens = 0, first = 0;
  try {
    const res = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify(body),
                                                      signal: controller.signal });
    if (!res.ok) throw new Error((await res.json()).error?.message || res.statusText);
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const event = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
        if (!event.startsWith('data: ')) continue;
        const data = event.slice(6);
        if (data === '[DONE]') continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage && first) {  // exact: a chunk can carry several tokens
          const seconds = (performance.now() - first) / 1000;
          if (seconds > 0) $('reply_tps').textContent = (chunk.usage.completion_tokens / seconds).toFixed(1) + ' tok/s';
        }
        const delta = chunk.choices?.[0]?.delta?.content;
        if (delta) {
          if (!first) first = performance.now();
          reply += delta; tokens++;
          out.textContent = reply;
          $('log').scrollTop = $('log').scrollHeight;
          const seconds = (performance.now() - first) / 1000;
          if (seconds > 0) $('reply_tps').textContent = (tokens / seconds).toFixed(1) + ' tok/s';
        }
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') { out.className = 'msg error'; out.textContent = reply + '\n[' + e.message + ']'; }
  }
  history.push({ role: 'assistant', content: reply });
  controller = null;
  $('send').disabled = false; $('stop').disabled = true;
}

$('form').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('input').value.trim();
  if (!text || controller) return;
  $('input').value = '';
  send(text);
});
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); $('form').requestSubmit(); }
});
$('stop').addEventListener('click', () => controller && controller.abort());

async function poll() {
  try {
    const props = await (await fetch('/props')).json();
    $('model').textContent = props.model;
    $('placement').textContent = props.placement;
    $('server_tps').textContent = props.decode_tokens_per_s.toFixed(1) + ' tok/s';
    $('load').textContent = props.running + ' / ' + props.queued;
  } catch (e) {}
  setTimeout(poll, 2000);
}
poll();
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace tandem::server
