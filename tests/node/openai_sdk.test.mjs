// The official OpenAI Node SDK against the HTTP API: chat, streaming, tools (tool_choice required
// and named), structured output, logprobs and logit_bias, each parsed by the SDK itself.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startCoordinator } from './lib/coordinator.mjs';

let server;
let client;
before(async () => {
  server = await startCoordinator({ args: ['--api-key', 'sdk-key'] });
  client = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: 'sdk-key', maxRetries: 0 });
});
after(async () => { await server.stop(); });

const noThink = { chat_template_kwargs: { enable_thinking: false } };
const user = (content) => [{ role: 'user', content }];

test('chat: a completion with usage', async () => {
  const r = await client.chat.completions.create({
    model: 'any', messages: user('Hello'), max_tokens: 8, seed: 1 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(r.usage.prompt_tokens > 0);
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8);
});

test('stream: chunks, then the finish reason and usage', async () => {
  const stream = await client.chat.completions.create({
    model: 'any', messages: user('Count'), max_tokens: 12, seed: 2, stream: true,
    stream_options: { include_usage: true } });
  let chunks = 0;
  let finish = null;
  let usage = null;
  for await (const c of stream) {
    chunks++;
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
    if (c.usage) usage = c.usage;
  }
  assert.ok(chunks >= 2);
  assert.ok(finish === 'length' || finish === 'stop');
  assert.ok(usage && usage.completion_tokens > 0);
});

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather in a city',
    parameters: { type: 'object', additionalProperties: false, required: ['city', 'unit'],
      properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['C', 'F'] } } } } },
  { type: 'function', function: { name: 'set_alarm', parameters: {
    type: 'object', additionalProperties: false, required: ['hour'],
    properties: { hour: { type: 'integer', minimum: 0, maximum: 23 } } } } },
];

test('tools: tool_choice required always gives a parseable call', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({
      model: 'any', messages: user('What is the weather?'), tools, tool_choice: 'required',
      parallel_tool_calls: false, max_tokens: 400, seed, temperature: 1.0, ...noThink });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.ok(['get_weather', 'set_alarm'].includes(call.function.name));
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') assert.ok(['C', 'F'].includes(args.unit));
    else assert.ok(Number.isInteger(args.hour));
  }
});

test('tools: a named function is the one called, streamed', async () => {
  const stream = await client.chat.completions.create({
    model: 'any', messages: user('Wake me'), tools, max_tokens: 600, seed: 5, stream: true,
    // One call with a bounded argument: the grammar then ends the call within the budget
    // whatever the random-weight model prefers (unbounded, it may sample digits or further calls
    // until max_tokens, depending on the last bits of its logits).
    parallel_tool_calls: false,
    tool_choice: { type: 'function', function: { name: 'set_alarm' } }, ...noThink });
  const calls = [];  // by index, as the SDK's users assemble them
  let finish = null;
  for await (const c of stream) {
    for (const t of c.choices[0]?.delta?.tool_calls ?? []) {
      calls[t.index] ??= { name: '', args: '' };
      if (t.function?.name) calls[t.index].name += t.function.name;
      if (t.function?.arguments) calls[t.index].args += t.function.arguments;
    }
    if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.ok(calls.length >= 1);
  for (const call of calls) {
    assert.equal(call.name, 'set_alarm');
    const hour = JSON.parse(call.args).hour;
    assert.ok(Number.isInteger(hour) && hour >= 0 && hour <= 23, call.args);
  }
  assert.equal(finish, 'tool_calls');
});

test('structured output: response_format json_schema', async () => {
  const r = await client.chat.completions.create({
    model: 'any', messages: user('A person'), max_tokens: 500, seed: 6, ...noThink,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: {
      type: 'object', additionalProperties: false, required: ['name', 'age'],
      properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer' } } } } } });
  const doc = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof doc.name, 'string');
  assert.ok(doc.name.length <= 8);
  assert.ok(Number.isInteger(doc.age));
});

test('logprobs: ordered, normalised, greedy picks the top one', async () => {
  const r = await client.chat.completions.create({
    model: 'any', messages: user('Hi'), max_tokens: 6, temperature: 0, logprobs: true,
    top_logprobs: 5 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const e of content) {
    assert.equal(e.top_logprobs.length, 5);
    assert.ok(e.logprob <= 0);
    let sum = 0;
    for (let i = 0; i < e.top_logprobs.length; i++) {
      const t = e.top_logprobs[i];
      assert.ok(t.logprob <= 0);
      if (i > 0) assert.ok(t.logprob <= e.top_logprobs[i - 1].logprob);
      assert.deepEqual(Buffer.from(t.bytes).toString('latin1').length, t.bytes.length);
      sum += Math.exp(t.logprob);
    }
    assert.ok(sum <= 1 + 1e-4, `probabilities sum to ${sum}`);
    // Greedy: the chosen token is the most likely one.
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5);
  }
  // The completions API's shape, and the same numbers as the chat API's for the same text.
  const t = await client.completions.create({
    model: 'any', prompt: 'Once', max_tokens: 4, temperature: 0, logprobs: 3 });
  const lp = t.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs.length, 4);
  assert.equal(lp.top_logprobs.length, 4);
  assert.deepEqual(lp.text_offset.slice(0, 1), [0]);
  for (let i = 0; i < 4; i++) {
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-5);
  }
});

test('logit_bias: -100 bans the greedy choice, by id and by text', async () => {
  const first = async (extra) => {
    const r = await client.chat.completions.create({
      model: 'any', messages: user('Go'), max_tokens: 1, temperature: 0, logprobs: true, ...extra });
    return r.choices[0].logprobs.content[0];
  };
  const greedy = await first({});
  assert.ok(Number.isInteger(greedy.id));
  const banned = await first({ logit_bias: { [greedy.id]: -100 } });
  assert.notEqual(banned.id, greedy.id);
  // llama-server's form: [text, false] bans every token of the text.
  const word = Buffer.from(greedy.bytes).toString('utf8');
  const byText = await first({ logit_bias: [[word, false]] });
  const res = await fetch(`${server.baseUrl}/tokenize`, {
    method: 'POST', headers: { Authorization: 'Bearer sdk-key', 'Content-Type': 'application/json' },
    body: JSON.stringify({ content: word }) });
  const ids = (await res.json()).tokens;
  assert.ok(!ids.includes(byText.id), `${byText.id} is one of ${ids}`);
});
