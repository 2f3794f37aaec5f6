// Structured output end to end: every schema of schemas.mjs sent as response_format json_schema,
// whole and streamed, must come back as JSON that Ajv (not our code) validates against it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv2020 from 'ajv/dist/2020.js';
import { startCoordinator } from './lib/coordinator.mjs';
import { schemas } from './schemas.mjs';

let server;
before(async () => { server = await startCoordinator(); });
after(async () => { await server.stop(); });

const ajv = new Ajv2020({ strict: false, allErrors: true });

async function post(path, body) {
  const res = await fetch(server.baseUrl + path, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
  return res;
}

function chatBody(schema, extra = {}) {
  return {
    messages: [{ role: 'user', content: 'Answer in JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'answer', schema, strict: true } },
    // The test model's weights are random: its own choice never ends a think block.
    chat_template_kwargs: { enable_thinking: false },
    max_tokens: 1500, seed: 7, temperature: 0.8, ...extra,
  };
}

async function streamedText(res) {
  const text = await res.text();
  let content = '';
  let finish = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const j = JSON.parse(line.slice(6));
    if (j.error) throw new Error(JSON.stringify(j.error));
    for (const c of j.choices) {
      if (c.delta?.content) content += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { content, finish };
}

for (const { name, schema } of schemas) {
  test(`json_schema ${name}`, async () => {
    const validate = ajv.compile(schema);
    for (const seed of [1, 2]) {
      const res = await post('/v1/chat/completions', chatBody(schema, { seed }));
      assert.equal(res.status, 200, await res.clone().text());
      const j = await res.json();
      const { content } = j.choices[0].message;
      assert.equal(j.choices[0].finish_reason, 'stop', `did not finish: ${content}`);
      const doc = JSON.parse(content);
      assert.ok(validate(doc), `${content}\n${ajv.errorsText(validate.errors)}`);
    }
    const res = await post('/v1/chat/completions', chatBody(schema, { seed: 3, stream: true }));
    assert.equal(res.status, 200);
    const { content, finish } = await streamedText(res);
    assert.equal(finish, 'stop', `did not finish: ${content}`);
    const doc = JSON.parse(content);
    assert.ok(validate(doc), `${content}\n${ajv.errorsText(validate.errors)}`);
  });
}

test('json_object: a JSON object, and the completions API takes json_schema too', async () => {
  const res = await post('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'JSON please' }], response_format: { type: 'json_object' },
    chat_template_kwargs: { enable_thinking: false }, max_tokens: 3000, seed: 5, temperature: 0.7 });
  assert.equal(res.status, 200);
  const j = await res.json();
  // Random weights may run out of tokens inside a free-form object; what was finished must parse.
  if (j.choices[0].finish_reason === 'stop') {
    const doc = JSON.parse(j.choices[0].message.content);
    assert.equal(typeof doc, 'object');
    assert.ok(doc !== null && !Array.isArray(doc));
  }
  const schema = schemas[0].schema;
  const r2 = await post('/v1/completions', {
    prompt: 'Data:', json_schema: schema, max_tokens: 1500, seed: 9 });
  assert.equal(r2.status, 200);
  const t = await r2.json();
  assert.ok(ajv.compile(schema)(JSON.parse(t.choices[0].text)), t.choices[0].text);
});

test('bad schemas and grammars are refused with 400 naming the field', async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '^a+$' } } } }, /pattern/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#/$defs/missing' } } } }, /missing/],
    [{ grammar: 'root ::= undefined-rule' }, /undefined-rule/],
    [{ grammar: 'root ::= "unterminated' }, /grammar/],
    [{ grammar: 'root ::= root "a"' }, /recurs/],
    [{ response_format: { type: 'json_object' }, grammar: 'root ::= "a"' }, /cannot be combined/],
  ];
  for (const [extra, pattern] of cases) {
    const res = await post('/v1/chat/completions', {
      messages: [{ role: 'user', content: 'x' }], max_tokens: 4, ...extra });
    const body = await res.text();
    assert.equal(res.status, 400, body);
    assert.match(body, pattern);
  }
});

test('a GBNF grammar constrains the output exactly', async () => {
  const res = await post('/v1/completions', {
    prompt: 'Pick:', grammar: 'root ::= ("yes" | "no") " " [0-9]{2}', max_tokens: 50, seed: 4 });
  assert.equal(res.status, 200);
  const j = await res.json();
  assert.match(j.choices[0].text, /^(yes|no) [0-9]{2}$/);
  assert.equal(j.choices[0].finish_reason, 'stop');
});
