// chat.test.mjs — the official openai client against a real nightshift
// serve (tiny-qwen3, random weights): chat (streaming and not, usage in the
// final chunk), stop strings, seeds, logprobs, the request side of a tool
// call round trip, chat templates equal to the Hugging Face goldens, greedy
// completions equal to the golden continuations.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { SHARED, startServer } from './server.mjs';

let srv;
before(async () => {
  srv = await startServer();
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

const hi = [{ role: 'user', content: 'Hi' }];

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('models', async () => {
  const { data: list, response } = await srv.client.models.list().withResponse();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'tiny-qwen3');
  assert.equal(list.data[0].object, 'model');
  // the default CPU pool holds 4 contexts: the effective context is the model's
  assert.equal(list.data[0].model_context_length, 40960);
  assert.equal(list.data[0].context_length, 40960);
  assert.equal(response.headers.get('x-nightshift-max-context-tokens'), '40960');
});

test('chat non-streaming', async () => {
  const r = await srv.client.chat.completions.create({ model: 'tiny-qwen3', messages: hi, max_tokens: 8, temperature: 0 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.created, 'number');
  assert.equal(r.model, 'tiny-qwen3');
  assert.match(r.system_fingerprint, /^fp_/);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(c.message.content.length > 0);
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, 9); // <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n
  assert.equal(r.usage.completion_tokens, 8);
  assert.equal(r.usage.total_tokens, 17);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat streaming with usage in the final chunk', async () => {
  const whole = await srv.client.chat.completions.create({ messages: hi, max_tokens: 10, temperature: 0, model: 'm' });
  const chunks = await collect(
    await srv.client.chat.completions.create({
      model: 'm',
      messages: hi,
      max_tokens: 10,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    }),
  );
  assert.ok(chunks.length >= 3);
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1);
  assert.match(chunks[0].id, /^chatcmpl-/);
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, whole.choices[0].message.content);
  const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.equal(fin.length, 1);
  assert.equal(fin[0].choices[0].finish_reason, 'length');
  const last = chunks.at(-1);
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.prompt_tokens, 9);
  assert.equal(last.usage.completion_tokens, 10);
  assert.equal(last.usage.total_tokens, 19);
  // the same prompt again: its KV comes from the prefix cache
  assert.ok(last.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(last.usage));
  assert.ok(last.usage.prompt_tokens_details.cached_tokens < 9);
});

test('stop strings across token boundaries, never emitted', async () => {
  const base = await srv.client.chat.completions.create({ model: 'm', messages: hi, max_tokens: 12, temperature: 0 });
  const T = base.choices[0].message.content;
  assert.ok(T.length >= 6, T);
  const stop = T.slice(2, 5); // greedy tiny-qwen3 tokens are 3 characters: this spans two
  const want = T.slice(0, T.indexOf(stop));
  const r = await srv.client.chat.completions.create({ model: 'm', messages: hi, max_tokens: 12, temperature: 0, stop });
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(r.usage.completion_tokens < 12);
  const chunks = await collect(
    await srv.client.chat.completions.create({
      model: 'm',
      messages: hi,
      max_tokens: 12,
      temperature: 0,
      stop: ['never-there', stop],
      stream: true,
    }),
  );
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), want);
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  const none = await srv.client.chat.completions.create({ model: 'm', messages: hi, max_tokens: 12, temperature: 0, stop: ['zzzz'] });
  assert.equal(none.choices[0].message.content, T);
});

test('seed reproducibility', async () => {
  const ask = (seed) =>
    srv.client.chat.completions
      .create({ model: 'm', messages: [{ role: 'user', content: 'Write a story' }], max_tokens: 12, temperature: 0.8, seed })
      .then((r) => r.choices[0].message.content);
  const a = await ask(1234);
  const b = await ask(1234);
  assert.equal(a, b);
  const others = await Promise.all([1, 2, 3, 4].map(ask));
  assert.ok(new Set([a, ...others]).size >= 3, 'different seeds should usually differ');
});

test('logprobs in the OpenAI shape', async () => {
  const r = await srv.client.chat.completions.create({
    model: 'm',
    messages: hi,
    max_tokens: 4,
    temperature: 0,
    logprobs: true,
    top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 4);
  let text = '';
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token); // greedy picks the most likely
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
    text += e.token;
  }
  assert.equal(text, r.choices[0].message.content);
  const s = await collect(
    await srv.client.chat.completions.create({ model: 'm', messages: hi, max_tokens: 3, temperature: 0, logprobs: true, stream: true }),
  );
  const n = s.reduce((k, c) => k + (c.choices[0]?.logprobs?.content?.length ?? 0), 0);
  assert.equal(n, 3);
});

const tools = [
  {
    type: 'function',
    function: {
      name: 'read_file',
      description: 'Read a file from the workspace.',
      parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
    },
  },
];

test('tool call round trip: assistant tool_calls and tool results are accepted and rendered', async () => {
  const messages = [
    { role: 'system', content: 'You are a coding agent.' },
    { role: 'user', content: 'Show me main.c' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [{ id: 'call_abc', type: 'function', function: { name: 'read_file', arguments: '{"path": "src/main.c"}' } }],
    },
    { role: 'tool', tool_call_id: 'call_abc', content: 'int main(void) { return 0; }' },
  ];
  const r = await srv.client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 4, temperature: 0 });
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 100);
  const t = await srv.post('/apply-template', { messages, tools });
  assert.equal(t.status, 200);
  assert.ok(t.json.prompt.includes('<tools>\n{"type": "function", "function": {"name": "read_file"'), t.json.prompt);
  assert.ok(
    t.json.prompt.includes('<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.c"}}\n</tool_call><|im_end|>'),
    t.json.prompt,
  );
  assert.ok(t.json.prompt.includes('<|im_start|>user\n<tool_response>\nint main(void) { return 0; }\n</tool_response><|im_end|>'));
  assert.ok(t.json.prompt.endsWith('<|im_start|>assistant\n'));
  // arguments as an object render the same
  messages[2].tool_calls[0].function.arguments = { path: 'src/main.c' };
  const t2 = await srv.post('/apply-template', { messages, tools });
  assert.equal(t2.json.prompt, t.json.prompt);
  // streaming with tools offered works too
  const chunks = await collect(
    await srv.client.chat.completions.create({ model: 'm', messages, tools, max_tokens: 3, temperature: 0, stream: true }),
  );
  assert.ok(chunks.at(-1).choices[0].finish_reason);
});

for (const model of ['tiny-qwen3', 'tiny-llama3']) {
  test(`apply-template equals the Hugging Face goldens (${model})`, async () => {
    const s = model === 'tiny-qwen3' ? srv : await startServer({ model });
    try {
      const golden = JSON.parse(fs.readFileSync(path.join(SHARED, 'goldens', `template-${model}.json`), 'utf8'));
      assert.ok(golden.cases.length > 0);
      for (const [i, c] of golden.cases.entries()) {
        const body = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, chat_template_kwargs: c.kwargs };
        if (c.tools) body.tools = c.tools;
        const r = await s.post('/apply-template', body);
        if (c.rendered === null) {
          assert.ok(r.status >= 400 && r.status < 500, `case ${i}: expected a 4xx for "${c.error}"`);
          assert.equal(typeof r.json.error.message, 'string');
        } else {
          assert.equal(r.status, 200, `case ${i}: ${r.text}`);
          assert.equal(r.json.prompt, c.rendered, `case ${i}`);
        }
      }
    } finally {
      if (s !== srv) await s.stop();
    }
  });
}

test('greedy /v1/completions with token-id prompts reproduces the golden continuations', async () => {
  const golden = JSON.parse(fs.readFileSync(path.join(SHARED, 'goldens', 'logits-tiny-qwen3.json'), 'utf8'));
  for (const p of golden.prompts) {
    const r = await srv.client.completions.create({
      model: 'tiny-qwen3',
      prompt: p.prompt_ids,
      max_tokens: 48,
      temperature: 0,
      return_token_ids: true,
    });
    assert.equal(r.object, 'text_completion');
    assert.deepEqual(r.choices[0].token_ids, p.greedy_48, p.label);
    const d = await srv.post('/detokenize', { tokens: p.greedy_48 });
    assert.equal(r.choices[0].text, d.json.content, p.label);
    assert.equal(r.usage.prompt_tokens, p.prompt_ids.length);
    assert.equal(r.usage.completion_tokens, 48);
    assert.equal(r.choices[0].finish_reason, 'length');
  }
  // streaming gives the same text
  const p = golden.prompts[0];
  let text = '';
  for await (const c of await srv.client.completions.create({ model: 'm', prompt: p.prompt_ids, max_tokens: 48, temperature: 0, stream: true }))
    text += c.choices[0]?.text ?? '';
  const d = await srv.post('/detokenize', { tokens: p.greedy_48 });
  assert.equal(text, d.json.content);
});

test('completions logprobs in the legacy shape', async () => {
  const r = await srv.client.completions.create({ model: 'm', prompt: 'Hi', max_tokens: 3, temperature: 0, logprobs: 2 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 3);
  assert.equal(lp.token_logprobs.length, 3);
  assert.equal(lp.top_logprobs.length, 3);
  assert.equal(Object.keys(lp.top_logprobs[0]).length, 2);
  assert.deepEqual(lp.text_offset.slice(0, 1), [0]);
  assert.equal(lp.tokens.join(''), r.choices[0].text);
  for (const v of lp.token_logprobs) assert.ok(v <= 0);
});

test('tokenize / detokenize', async () => {
  const t = await srv.post('/tokenize', { content: 'Hello world' });
  assert.deepEqual(t.json.tokens, [9707, 1879]);
  const d = await srv.post('/detokenize', { tokens: t.json.tokens });
  assert.equal(d.json.content, 'Hello world');
  const p = await srv.post('/tokenize', { content: 'Hi', with_pieces: true });
  assert.deepEqual(p.json.tokens, [{ id: 13048, piece: 'Hi' }]);
});

test('text prompt completions and metrics', async () => {
  const r = await srv.client.completions.create({ model: 'm', prompt: 'Once upon a time', max_tokens: 5, temperature: 0 });
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.usage.prompt_tokens, 4);
  const m = await fetch(srv.base + '/metrics').then((x) => x.text());
  assert.match(m, /^nightshift_requests_running \d+$/m);
  assert.match(m, /^nightshift_prompt_tokens_total \d+$/m);
  assert.match(m, /^nightshift_prefix_cache_hit_tokens_total \d+$/m);
  assert.match(m, /^nightshift_time_to_first_token_seconds_bucket\{le="\+Inf"\} \d+$/m);
  assert.match(m, /^nightshift_kv_pages\{state="free"\} \d+$/m);
});
