// responses.test.mjs — the official openai client's responses API against
// a real nightshift serve (tiny-qwen3, random weights): responses.create
// whole and streamed (event order, sequence numbers, the final response),
// a function call round trip (function_call + function_call_output items)
// whose turns hit the prefix cache (input_tokens_details.cached_tokens),
// reasoning items echoed back, the same prompt as the equivalent chat
// completion, stateless refusals, hosted tools not offered.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startServer } from './server.mjs';

const PAGE = 16;
let srv;
before(async () => {
  srv = await startServer({ args: ['--page-size', String(PAGE)] });
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

const tools = [
  {
    type: 'function',
    name: 'read_file',
    description: 'Read a file',
    parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
    strict: false,
  },
];

function checkUsage(u) {
  for (const k of ['input_tokens', 'output_tokens', 'total_tokens']) assert.ok(Number.isInteger(u[k]) && u[k] >= 0, k);
  assert.ok(Number.isInteger(u.input_tokens_details.cached_tokens));
  assert.ok(Number.isInteger(u.output_tokens_details.reasoning_tokens));
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
}

test('responses.create: a whole response', async () => {
  const r = await srv.client.responses.create({ model: 'tiny-qwen3', input: 'Hello', max_output_tokens: 5, temperature: 0 });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.store, false);
  assert.equal(r.usage.output_tokens, 5);
  checkUsage(r.usage);
  const msg = r.output.find((o) => o.type === 'message');
  assert.ok(msg && msg.role === 'assistant' && msg.content[0].type === 'output_text');
  assert.equal(r.output_text, msg.content[0].text); // the SDK's convenience field
});

test('responses.create stream: event order and the final response', async () => {
  const body = { model: 'tiny-qwen3', input: [{ role: 'user', content: 'Tell me a story' }], max_output_tokens: 6, temperature: 0 };
  const stream = await srv.client.responses.create({ ...body, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  assert.equal(types.at(-1), 'response.incomplete');
  events.forEach((e, i) => assert.equal(e.sequence_number, i, 'sequence numbers count up'));
  assert.equal(types.filter((t) => t === 'response.output_item.added').length, types.filter((t) => t === 'response.output_item.done').length);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  const final = events.at(-1).response;
  checkUsage(final.usage);
  const whole = await srv.client.responses.create(body);
  const text = (r) => r.output.filter((o) => o.type === 'message').map((o) => o.content[0].text).join('');
  assert.equal(deltas, text(final));
  assert.equal(text(final), text(whole), 'greedy: streamed equals whole');
});

test('function call round trip hits the prefix cache every turn (streamed, like Codex)', async () => {
  const input = [
    { type: 'message', role: 'developer', content: 'You are a coding agent.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Find why the build fails.' }] },
  ];
  let prev = 0;
  for (let turn = 0; turn < 4; turn++) {
    const stream = await srv.client.responses.create({
      model: 'tiny-qwen3',
      input,
      tools,
      stream: true,
      store: false,
      max_output_tokens: 6,
      include: ['reasoning.encrypted_content'],
    });
    let final;
    for await (const ev of stream) if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
    checkUsage(final.usage);
    assert.ok(final.usage.input_tokens > prev, 'prompts grow');
    if (turn > 0)
      assert.ok(
        final.usage.input_tokens_details.cached_tokens >= prev - PAGE,
        `turn ${turn}: cached ${final.usage.input_tokens_details.cached_tokens} < previous prompt ${prev} - ${PAGE}`,
      );
    prev = final.usage.input_tokens;
    // echo the output (reasoning with content null, as Codex does), add a call and its output
    for (const o of final.output) input.push(o.type === 'reasoning' ? { ...o, content: null } : o);
    const call_id = `call_${turn}`;
    input.push({ type: 'function_call', id: `fc_${turn}`, call_id, name: 'read_file', arguments: JSON.stringify({ path: `f${turn}.c` }) });
    input.push({ type: 'function_call_output', call_id, output: `int f${turn};` });
  }
});

test('the same prompt as the equivalent chat completion', async () => {
  const r = await srv.client.responses.create({
    model: 'tiny-qwen3',
    instructions: 'sys',
    input: [
      { role: 'user', content: 'hi' },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'calling' }] },
      { type: 'function_call', call_id: 't1', name: 'read_file', arguments: '{"path": "a.c"}' },
      { type: 'function_call_output', call_id: 't1', output: 'int a;' },
    ],
    tools,
    max_output_tokens: 1,
  });
  const c = await srv.client.chat.completions.create({
    model: 'm',
    max_tokens: 1,
    messages: [
      { role: 'system', content: 'sys' },
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'calling', tool_calls: [{ id: 't1', type: 'function', function: { name: 'read_file', arguments: '{"path": "a.c"}' } }] },
      { role: 'tool', tool_call_id: 't1', content: 'int a;' },
    ],
    tools: [{ type: 'function', function: { name: 'read_file', description: 'Read a file', parameters: tools[0].parameters } }],
  });
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
});

test('reasoning.effort none turns thinking off', async () => {
  const base = { model: 'tiny-qwen3', input: 'hi', max_output_tokens: 1 };
  const on = await srv.client.responses.create({ ...base, reasoning: { effort: 'medium' } });
  const off = await srv.client.responses.create({ ...base, reasoning: { effort: 'none' } });
  assert.ok(off.usage.input_tokens > on.usage.input_tokens, 'the empty <think></think> block is in the prompt');
});

test('stateless: previous_response_id and unknown fields are refused', async () => {
  await assert.rejects(
    srv.client.responses.create({ model: 'm', input: 'hi', previous_response_id: 'resp_x' }),
    (e) => e.status === 400 && e.param === 'previous_response_id',
  );
  await assert.rejects(srv.client.responses.create({ model: 'm', input: 'hi', frobnicate: true }), (e) => e.status === 400 && e.param === 'frobnicate');
  await assert.rejects(
    srv.client.responses.create({ model: 'm', input: [{ type: 'item_reference', id: 'x' }] }),
    (e) => e.status === 400 && /item_reference/.test(e.message),
  );
});

test('hosted tools are not offered; custom and namespace tools are', async () => {
  const { data, response } = await srv.client.responses
    .create({
      model: 'tiny-qwen3',
      input: 'hi',
      max_output_tokens: 2,
      tools: [
        ...tools,
        { type: 'web_search' },
        { type: 'custom', name: 'apply_patch', description: 'Apply a patch', format: { type: 'grammar', syntax: 'lark', definition: 'start: /.+/' } },
        { type: 'namespace', name: 'mcp', description: 'MCP tools', tools: [{ type: 'function', name: 'lookup', parameters: { type: 'object', properties: {} } }] },
      ],
    })
    .withResponse();
  assert.equal(response.headers.get('x-nightshift-ignored-tools'), 'web_search');
  checkUsage(data.usage);
  // apply_patch and lookup are in the prompt: it is longer than with read_file alone
  const plain = await srv.client.responses.create({ model: 'tiny-qwen3', input: 'hi', max_output_tokens: 1, tools });
  assert.ok(data.usage.input_tokens > plain.usage.input_tokens + 10);
});

test('models.retrieve', async () => {
  const m = await srv.client.models.retrieve('tiny-qwen3');
  assert.equal(m.id, 'tiny-qwen3');
  await assert.rejects(srv.client.models.retrieve('gpt-4o'), (e) => e.status === 404 && e.code === 'model_not_found');
});

test('a named tool_choice forces a function_call item, streamed as argument deltas', async () => {
  const body = {
    model: 'tiny-qwen3',
    input: 'Read a file.',
    max_output_tokens: 400,
    temperature: 0,
    tools: [{ type: 'function', name: 'read_file', parameters: { type: 'object', properties: { path: { type: 'string', maxLength: 8 } }, required: ['path'], additionalProperties: false } }],
    tool_choice: { type: 'function', name: 'read_file' },
  };
  const whole = await srv.client.responses.create(body);
  assert.equal(whole.status, 'completed');
  const call = whole.output.find((o) => o.type === 'function_call');
  assert.equal(call.name, 'read_file');
  assert.equal(typeof JSON.parse(call.arguments).path, 'string');
  const stream = await srv.client.responses.create({ ...body, tool_choice: 'required', stream: true });
  const args = {}, done = [];
  for await (const ev of stream) {
    if (ev.type === 'response.function_call_arguments.delta') args[ev.item_id] = (args[ev.item_id] ?? '') + ev.delta;
    if (ev.type === 'response.function_call_arguments.done') done.push(ev);
  }
  assert.ok(done.length >= 1, 'at least one call');
  for (const d of done) {
    assert.equal(d.name, 'read_file');
    assert.equal(args[d.item_id], d.arguments, 'the deltas add up to the arguments');
    assert.equal(typeof JSON.parse(d.arguments).path, 'string');
  }
});

test('tools for a template without tool support: 400 tools_not_supported on every API', async () => {
  const s = await startServer({ model: 'tiny-llama3' }); // its template renders no tools
  try {
    const fn = { name: 'f', parameters: { type: 'object', properties: {} } };
    const chat = await s.post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: fn }], max_tokens: 1 });
    assert.equal(chat.status, 400);
    assert.equal(chat.json.error.code, 'tools_not_supported');
    const resp = await s.post('/v1/responses', { input: 'hi', tools: [{ type: 'function', ...fn }], max_output_tokens: 1 });
    assert.equal(resp.status, 400);
    assert.equal(resp.json.error.code, 'tools_not_supported');
    const msg = await s.post('/v1/messages', { model: 'm', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }], tools: [{ name: 'f', input_schema: fn.parameters }] });
    assert.equal(msg.status, 400);
    assert.equal(msg.json.type, 'error');
    assert.match(msg.json.error.message, /does not support tools/);
    // without tools it serves
    const ok = await s.post('/v1/responses', { input: 'hi', max_output_tokens: 1, reasoning: { effort: 'low' } });
    assert.equal(ok.status, 200);
  } finally {
    await s.stop();
  }
});

test('text.format json_schema: every reply is valid JSON for the schema (ajv)', async () => {
  const { default: Ajv } = await import('ajv');
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 10 },
      n: { type: 'integer', minimum: 0, maximum: 9 },
      tags: { type: 'array', items: { enum: ['a', 'b'] }, maxItems: 3 },
    },
    required: ['name', 'n', 'tags'],
    additionalProperties: false,
  };
  const validate = new Ajv().compile(schema);
  for (let i = 0; i < 5; i++) {
    const r = await srv.client.responses.create({
      model: 'tiny-qwen3',
      input: `give json ${i}`,
      temperature: 0, // greedy: deterministic (sampled whitespace can run past any limit)
      max_output_tokens: 600,
      text: { format: { type: 'json_schema', name: 'x', schema, strict: true } },
      reasoning: { effort: 'none' },
    });
    assert.equal(r.status, 'completed', `reply ${i} ended: ${JSON.stringify(r.incomplete_details)}`);
    const v = JSON.parse(r.output_text);
    assert.ok(validate(v), `reply ${i}: ${JSON.stringify(validate.errors)} for ${r.output_text}`);
  }
});
