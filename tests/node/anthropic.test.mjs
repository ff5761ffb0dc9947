// anthropic.test.mjs — the official @anthropic-ai/sdk against a real
// nightshift serve (tiny-qwen3, random weights: the text is noise, so the
// checks are on shapes, events, usage and what must be deterministic):
// messages.create and messages.stream (text, stop sequences, a tool use
// round trip with tool_result, thinking blocks with signatures in the
// history, thinking on/off), countTokens equal to the equivalent chat
// completion's prompt, errors in Anthropic's shape, x-api-key, and the
// prefix cache seen through cache_read_input_tokens.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './server.mjs';

const PAGE = 16;
const KEY = 'sk-test-anthropic';
let srv, client;
before(async () => {
  srv = await startServer({ args: ['--page-size', String(PAGE), '--api-key', KEY] });
  client = new Anthropic({ baseURL: srv.base, apiKey: KEY, maxRetries: 0, timeout: 120000 });
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

const tools = [
  {
    name: 'read_file',
    description: 'Read a file',
    input_schema: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
  },
];

function checkUsage(u) {
  for (const k of ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert.ok(Number.isInteger(u[k]) && u[k] >= 0, `usage.${k} = ${u[k]}`);
}
const promptOf = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;

test('messages.create: a text reply in the Messages shape', async () => {
  const m = await client.messages.create({
    model: 'tiny-qwen3',
    max_tokens: 6,
    system: [{ type: 'text', text: 'You are terse.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Hello' }],
    metadata: { user_id: 'u1' },
  });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'tiny-qwen3');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 6);
  checkUsage(m.usage);
  assert.ok(m.content.every((b) => b.type === 'text' || b.type === 'thinking'));
});

test('messages.stream: the full event sequence and the final message', async () => {
  const stream = client.messages.stream({
    model: 'tiny-qwen3',
    max_tokens: 8,
    temperature: 0,
    messages: [{ role: 'user', content: 'Tell me a story' }],
  });
  const types = [];
  for await (const ev of stream) types.push(ev.type);
  const m = await stream.finalMessage();
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  const starts = types.filter((t) => t === 'content_block_start').length;
  assert.equal(starts, types.filter((t) => t === 'content_block_stop').length);
  assert.ok(types.includes('content_block_delta'));
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 8);
  checkUsage(m.usage);
  // greedy: the same text as the whole reply
  const whole = await client.messages.create({
    model: 'tiny-qwen3',
    max_tokens: 8,
    temperature: 0,
    messages: [{ role: 'user', content: 'Tell me a story' }],
  });
  const text = (mm) => mm.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(text(m), text(whole));
});

test('stop_sequences end the reply with stop_reason stop_sequence', async () => {
  const body = { model: 'tiny-qwen3', max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Count' }] };
  const full = await client.messages.create(body);
  const t = full.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(t.length >= 4, `greedy text long enough: ${JSON.stringify(t)}`);
  const stop = t.slice(2, 4);
  const cut = await client.messages.create({ ...body, stop_sequences: ['never-seen-xyz', stop] });
  assert.equal(cut.stop_reason, 'stop_sequence');
  assert.equal(cut.stop_sequence, stop);
  const ct = cut.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.equal(ct, t.slice(0, t.indexOf(stop)));
  // streamed: the same through message_delta
  const s = client.messages.stream({ ...body, stop_sequences: [stop] });
  const m = await s.finalMessage();
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
});

test('tool use round trip with tool_result and thinking history hits the prefix cache', async () => {
  const messages = [{ role: 'user', content: 'Find why the build fails.' }];
  let prev = 0;
  for (let turn = 0; turn < 4; turn++) {
    const stream = client.messages.stream({
      model: 'tiny-qwen3',
      max_tokens: 6,
      system: 'You are a coding agent.',
      messages,
      tools,
      tool_choice: { type: 'auto' },
    });
    const m = await stream.finalMessage();
    checkUsage(m.usage);
    const total = promptOf(m.usage);
    assert.ok(total > prev, 'prompts grow');
    if (turn > 0)
      assert.ok(
        m.usage.cache_read_input_tokens >= prev - PAGE,
        `turn ${turn}: cache_read ${m.usage.cache_read_input_tokens} < previous prompt ${prev} - ${PAGE}`,
      );
    prev = total;
    // the client keeps the reply (text) and adds a thinking block with a
    // signature and a tool call, then answers the call
    const id = `toolu_${turn}`;
    messages.push({
      role: 'assistant',
      content: [
        { type: 'thinking', thinking: `I should read f${turn}.`, signature: 'sig' + turn },
        ...m.content.filter((b) => b.type === 'text'),
        { type: 'tool_use', id, name: 'read_file', input: { path: `src/f${turn}.c` } },
      ],
    });
    messages.push({
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: id, content: [{ type: 'text', text: `int f${turn};` }], is_error: turn === 2 }],
    });
  }
});

test('countTokens equals the equivalent chat completion prompt', async () => {
  const anthropic = {
    model: 'tiny-qwen3',
    system: 'sys',
    messages: [
      { role: 'user', content: 'hi' },
      {
        role: 'assistant',
        content: [
          { type: 'text', text: 'calling' },
          { type: 'tool_use', id: 't1', name: 'read_file', input: { path: 'a.c' } },
        ],
      },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'int a;' }, { type: 'text', text: 'go on' }] },
    ],
    tools,
  };
  const { input_tokens } = await client.messages.countTokens(anthropic);
  const chat = await fetch(srv.base + '/v1/chat/completions', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({
      max_tokens: 1,
      messages: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: 'hi' },
        {
          role: 'assistant',
          content: 'calling',
          tool_calls: [{ id: 't1', type: 'function', function: { name: 'read_file', arguments: { path: 'a.c' } } }],
        },
        { role: 'tool', tool_call_id: 't1', content: 'int a;' },
        { role: 'user', content: 'go on' },
      ],
      tools: tools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } })),
    }),
  }).then((r) => r.json());
  assert.equal(input_tokens, chat.usage.prompt_tokens);
});

test('thinking disabled switches the template off (Qwen3 enable_thinking)', async () => {
  const base = { model: 'tiny-qwen3', messages: [{ role: 'user', content: 'hi' }] };
  const on = await client.messages.countTokens({ ...base, thinking: { type: 'adaptive' } });
  const off = await client.messages.countTokens({ ...base, thinking: { type: 'disabled' } });
  const dflt = await client.messages.countTokens(base);
  assert.equal(on.input_tokens, dflt.input_tokens);
  assert.ok(off.input_tokens > on.input_tokens, 'the empty <think></think> block is in the prompt');
  const en = await client.messages.countTokens({ ...base, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(en.input_tokens, on.input_tokens);
  await assert.rejects(
    client.messages.create({ ...base, max_tokens: 1024, thinking: { type: 'enabled', budget_tokens: 1024 } }),
    (e) => e.status === 400 && /budget_tokens/.test(e.error?.error?.message),
  );
});

test('errors come in the Anthropic shape', async () => {
  await assert.rejects(
    client.messages.create({ model: 'tiny-qwen3', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error' && /max_tokens/.test(e.message),
  );
  await assert.rejects(
    client.messages.create({ model: 'tiny-qwen3', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }], frobnicate: 1 }),
    (e) => e.status === 400 && /frobnicate/.test(e.error?.error?.message),
  );
  await assert.rejects(
    client.messages.create({ model: 'tiny-qwen3', max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error',
  );
  const bad = new Anthropic({ baseURL: srv.base, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(
    bad.messages.create({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e.status === 401 && e.error?.type === 'error' && e.error?.error?.type === 'authentication_error',
  );
});

// The refusals the server makes before any handler runs (wrong key, unknown
// path, wrong method, oversize body, wrong media type) have Anthropic's shape
// on Anthropic's paths too, and OpenAI's elsewhere.
test('refusals before the handler come in the Anthropic shape on /v1/messages', async () => {
  const raw = (method, path, headers, body) =>
    new Promise((resolve, reject) => {
      const req = http.request(srv.base + path, { method, headers }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(text) }));
      });
      req.on('error', reject);
      req.end(body);
    });
  const json = { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' };
  const ok = JSON.stringify({ model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] });
  const cases = [
    ['POST', '/v1/messages', { ...json, 'x-api-key': 'wrong' }, ok, 401, 'authentication_error'],
    ['POST', '/v1/messages/count_tokens', { ...json, 'x-api-key': 'wrong' }, ok, 401, 'authentication_error'],
    ['POST', '/v1/messages/nope', json, ok, 404, 'not_found_error'],
    ['GET', '/v1/messages', json, undefined, 405, 'invalid_request_error'],
    ['POST', '/v1/messages', { ...json, 'content-type': 'text/plain' }, ok, 415, 'invalid_request_error'],
    ['POST', '/v1/messages', { ...json, 'content-length': '99999999999' }, undefined, 413, 'request_too_large'],
  ];
  for (const [method, path, headers, body, status, type] of cases) {
    const r = await raw(method, path, headers, body);
    assert.equal(r.status, status, `${method} ${path}`);
    assert.equal(r.body.type, 'error', `${method} ${path}: ${JSON.stringify(r.body)}`);
    assert.equal(r.body.error?.type, type, `${method} ${path}: ${JSON.stringify(r.body)}`);
    assert.equal(typeof r.body.error?.message, 'string');
  }
  // an OpenAI path keeps OpenAI's shape
  const o = await raw('POST', '/v1/chat/completions', { ...json, 'x-api-key': 'wrong' }, ok);
  assert.equal(o.status, 401);
  assert.equal(o.body.error?.code, 'invalid_api_key');
  assert.equal(o.body.type, undefined);
});

test('hosted tools are not offered and are named in a header', async () => {
  const { response, data } = await client.messages
    .create({
      model: 'tiny-qwen3',
      max_tokens: 2,
      messages: [{ role: 'user', content: 'hi' }],
      tools: [...tools, { type: 'web_search_20250305', name: 'web_search', max_uses: 2 }],
    })
    .withResponse();
  assert.equal(response.headers.get('x-nightshift-ignored-tools'), 'web_search');
  checkUsage(data.usage);
  assert.match(srv.log(), /tools not offered to the model.*web_search/);
});

test('tool_choice any/tool force a valid call, streamed as input_json_delta', async () => {
  const body = {
    model: 'tiny-qwen3',
    max_tokens: 400,
    temperature: 0,
    messages: [{ role: 'user', content: 'Read a file.' }],
    tools: [
      {
        name: 'read_file',
        input_schema: {
          $schema: 'http://json-schema.org/draft-07/schema#',
          type: 'object',
          properties: { path: { type: 'string', maxLength: 8 } },
          required: ['path'],
          additionalProperties: false,
        },
      },
    ],
  };
  const whole = await client.messages.create({ ...body, tool_choice: { type: 'tool', name: 'read_file' } });
  assert.equal(whole.stop_reason, 'tool_use');
  const use = whole.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'read_file');
  assert.equal(typeof use.input.path, 'string');
  assert.ok(use.input.path.length <= 8);
  const stream = client.messages.stream({ ...body, tool_choice: { type: 'any' } });
  const frags = {};
  stream.on('streamEvent', (ev) => {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta')
      frags[ev.index] = (frags[ev.index] ?? '') + ev.delta.partial_json;
  });
  const m = await stream.finalMessage();
  assert.equal(m.stop_reason, 'tool_use');
  const uses = m.content.map((b, i) => [b, i]).filter(([b]) => b.type === 'tool_use');
  assert.ok(uses.length >= 1);
  for (const [b, i] of uses) {
    assert.equal(b.name, 'read_file');
    assert.match(b.id, /^call_/);
    assert.deepEqual(JSON.parse(frags[i]), b.input, 'the streamed fragments are the input');
  }
});

test('a final assistant message is a prefill the reply continues', async () => {
  const messages = [
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: 'The answer is' },
  ];
  const { input_tokens } = await client.messages.countTokens({ model: 'tiny-qwen3', messages });
  const post = (p, body) =>
    fetch(srv.base + p, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify(body),
    }).then((r) => r.json());
  const t = await post('/apply-template', { messages, continue_final_message: true });
  assert.ok(t.prompt.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is'), JSON.stringify(t.prompt));
  const chat = await post('/v1/chat/completions', { messages, continue_final_message: true, max_tokens: 1 });
  assert.equal(input_tokens, chat.usage.prompt_tokens, 'the same prompt as chat with continue_final_message');
  const m = await client.messages.create({ model: 'tiny-qwen3', max_tokens: 3, messages });
  assert.equal(m.usage.output_tokens, 3);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens, input_tokens);
});

test('output_config.format json_schema: the reply is valid JSON for the schema (ajv)', async () => {
  const { default: Ajv } = await import('ajv');
  const schema = {
    type: 'object',
    properties: { ok: { type: 'boolean' }, why: { type: 'string', maxLength: 12 } },
    required: ['ok', 'why'],
    additionalProperties: false,
  };
  const validate = new Ajv().compile(schema);
  for (let i = 0; i < 3; i++) {
    const m = await client.messages.create({
      model: 'tiny-qwen3',
      max_tokens: 600,
      temperature: 0, // greedy: deterministic (sampled whitespace can run past any limit)
      output_config: { format: { type: 'json_schema', schema } },
      thinking: { type: 'disabled' },
      messages: [{ role: 'user', content: `answer ${i}` }],
    });
    assert.equal(m.stop_reason, 'end_turn');
    const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    assert.ok(validate(JSON.parse(text)), `reply ${i}: ${JSON.stringify(validate.errors)} for ${text}`);
  }
});
