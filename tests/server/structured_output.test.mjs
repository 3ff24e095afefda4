// Structured output from a model with random weights: 20 random schemas of the supported subset,
// each reply parsed and checked against its schema by the validator below (written apart from the
// server's recognizer); json_object replies are objects; a streamed reply is the same document;
// unsupported or malformed schemas get a 400 naming the field, and the server keeps serving.
import { check, finish, fixture, postJson, startServer } from './harness.mjs';

const model = fixture('small-v2-Q4_K_M.gguf');
const server = await startServer(model, ['--parallel', '2', '--ctx', '1024']);

let seed = 12345;
const random = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (list) => list[Math.floor(random() * list.length)];
const words = ['name', 'age', 'city', 'tags', 'ok', 'score', 'items', 'note', 'id', 'kind'];

function randomSchema(depth) {
  const kinds = depth >= 3 ? ['string', 'integer', 'number', 'boolean', 'null', 'enum']
                           : ['string', 'integer', 'number', 'boolean', 'null', 'enum', 'array', 'object', 'object'];
  switch (pick(kinds)) {
    case 'string': {
      const s = { type: 'string' };
      if (random() < 0.5) s.minLength = Math.floor(random() * 3);
      if (random() < 0.5) s.maxLength = (s.minLength || 0) + 1 + Math.floor(random() * 10);
      return s;
    }
    case 'enum': return { enum: [pick(['red', 'green']), pick(['blue', 'x y']), pick([1, 10, -2, true, null])] };
    case 'array': {
      const s = { type: 'array', items: randomSchema(depth + 1) };
      if (random() < 0.5) s.minItems = Math.floor(random() * 2);
      if (random() < 0.7) s.maxItems = (s.minItems || 0) + Math.floor(random() * 3);
      return s;
    }
    case 'object': {
      const properties = {};
      const n = 1 + Math.floor(random() * 4);
      for (let i = 0; i < n; i++) properties[pick(words)] = randomSchema(depth + 1);
      const names = Object.keys(properties);
      return { type: 'object', properties, required: names.filter(() => random() < 0.6),
               additionalProperties: false };
    }
    default: return { type: pick(['string', 'integer', 'number', 'boolean', 'null']) };
  }
}

// Why `v` does not follow `schema`, or '' when it does.
function violation(schema, v, path = '$') {
  if (schema.enum) return schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v)) ? '' : `${path} not in enum`;
  switch (schema.type) {
    case 'string':
      if (typeof v !== 'string') return `${path} not a string`;
      if ([...v].length < (schema.minLength ?? 0)) return `${path} shorter than minLength`;
      if (schema.maxLength !== undefined && [...v].length > schema.maxLength) return `${path} longer than maxLength`;
      return '';
    case 'integer': return Number.isInteger(v) ? '' : `${path} not an integer`;
    case 'number': return typeof v === 'number' && Number.isFinite(v) ? '' : `${path} not a number`;
    case 'boolean': return typeof v === 'boolean' ? '' : `${path} not a boolean`;
    case 'null': return v === null ? '' : `${path} not null`;
    case 'array':
      if (!Array.isArray(v)) return `${path} not an array`;
      if (v.length < (schema.minItems ?? 0)) return `${path} has fewer than minItems`;
      if (schema.maxItems !== undefined && v.length > schema.maxItems) return `${path} has more than maxItems`;
      for (let i = 0; i < v.length; i++) {
        const why = violation(schema.items, v[i], `${path}[${i}]`);
        if (why) return why;
      }
      return '';
    case 'object':
      if (typeof v !== 'object' || v === null || Array.isArray(v)) return `${path} not an object`;
      for (const key of Object.keys(v)) {
        if (!(key in schema.properties)) return `${path}.${key} not a property`;
        const why = violation(schema.properties[key], v[key], `${path}.${key}`);
        if (why) return why;
      }
      for (const key of schema.required) if (!(key in v)) return `${path}.${key} missing`;
      return '';
  }
  return `${path}: unknown schema`;
}

const chat = (extra) => ({ messages: [{ role: 'user', content: 'Reply in JSON.' }], max_tokens: 160,
                           temperature: 1.0, ...extra });

try {
  for (let i = 0; i < 20; i++) {
    const schema = random() < 0.8 ? randomSchema(1) : randomSchema(0);
    const r = await postJson(server.base, '/v1/chat/completions',
                             chat({ seed: i, response_format: { type: 'json_schema',
                                                                json_schema: { name: `s${i}`, schema } } }));
    if (!check(r.status === 200, `schema ${i} answered`, r.text)) continue;
    const content = r.json.choices[0].message.content;
    let value, parsed = true;
    try { value = JSON.parse(content); } catch (e) { parsed = false; }
    if (!check(parsed, `schema ${i}: the reply parses`, `${content} for ${JSON.stringify(schema)}`)) continue;
    const why = violation(schema, value);
    check(!why, `schema ${i}: the reply follows its schema`, `${why}: ${content} for ${JSON.stringify(schema)}`);
    check(r.json.choices[0].finish_reason === 'stop', `schema ${i}: the reply ends with the document`,
          r.json.choices[0].finish_reason);
    if (i < 3) console.log(`schema ${JSON.stringify(schema)}\n  reply ${content}`);
  }

  const object = await postJson(server.base, '/v1/chat/completions', chat({ seed: 1, response_format: { type: 'json_object' } }));
  const parsedObject = (() => { try { return JSON.parse(object.json.choices[0].message.content); } catch (e) { return null; } })();
  check(parsedObject && typeof parsedObject === 'object' && !Array.isArray(parsedObject), 'json_object gives an object',
        object.text);

  // Streamed: the deltas make the same document as the whole reply with the same seed.
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, n: { type: 'integer' } },
                   required: ['city', 'n'] };
  const format = { type: 'json_schema', json_schema: { name: 'c', schema } };
  const whole = await postJson(server.base, '/v1/chat/completions', chat({ seed: 9, response_format: format }));
  const res = await fetch(server.base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(chat({ seed: 9, response_format: format, stream: true })) });
  let streamed = '';
  for (const event of (await res.text()).split('\n\n'))
    if (event.startsWith('data: {')) streamed += JSON.parse(event.slice(6)).choices[0]?.delta?.content ?? '';
  check(streamed === whole.json.choices[0].message.content, 'a streamed reply is the same document', streamed);
  check(!violation(schema, JSON.parse(streamed)), 'the streamed document follows its schema', streamed);

  // Malformed or unsupported: 400 naming the field.
  const s = 'response_format.json_schema.schema';
  const cases = [
    [{ type: 'xml' }, 'response_format.type'],
    [{ type: 'json_schema' }, 'response_format.json_schema'],
    [{ type: 'json_schema', json_schema: { schema: { type: 'object', properties: { a: { type: 'string', pattern: 'x' } } } } },
     `${s}.properties.a.pattern`],
    [{ type: 'json_schema', json_schema: { schema: { anyOf: [{ type: 'string' }] } } }, `${s}.anyOf`],
    [{ type: 'json_schema', json_schema: { schema: { type: ['string', 'null'] } } }, `${s}.type`],
    [{ type: 'json_schema', json_schema: { schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['b'] } } },
     `${s}.required`],
    [{ type: 'json_schema', json_schema: { schema: { type: 'string', minLength: -1 } } }, `${s}.minLength`],
    ['json', 'response_format'],
  ];
  for (const [response_format, param] of cases) {
    const r = await postJson(server.base, '/v1/chat/completions', chat({ response_format }));
    check(r.status === 400 && r.json?.error?.param === param, `400 naming ${param}`, `${r.status} ${r.text}`);
  }
  const tooShort = await postJson(server.base, '/v1/chat/completions',
                                  chat({ max_tokens: 5, response_format: format }));
  check(tooShort.status === 400 && /max_tokens/.test(tooShort.text), 'max_tokens below the shortest document: 400',
        tooShort.text);
  const after = await postJson(server.base, '/v1/chat/completions', chat({ max_tokens: 4 }));
  check(after.status === 200, 'the server still serves');
} finally {
  await server.stop();
}
finish('structured_output');
