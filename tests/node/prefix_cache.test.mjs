// prefix_cache.test.mjs — the agent workload over HTTP with the official
// openai client: a 20-turn conversation where each turn re-sends the whole
// history (previous prompt + the answer + a new tool result) must report
// cached_tokens >= the previous prompt's length minus one page; a request
// cancelled mid-prefill keeps its committed pages for the re-sent prompt;
// the per-request log line reports reuse.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { sleep, startServer } from './server.mjs';

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
    function: {
      name: 'read_file',
      description: 'Read a file',
      parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
    },
  },
];

test('20-turn agent replay hits the prefix cache every turn', async () => {
  const messages = [
    { role: 'system', content: 'You are a coding agent. Use tools to inspect the repository.' },
    { role: 'user', content: 'Find why the build fails.' },
  ];
  let prevPrompt = 0;
  for (let turn = 0; turn < 20; turn++) {
    const r = await srv.client.chat.completions.create({
      model: 'm',
      messages,
      tools,
      max_tokens: 12,
      temperature: 0,
    });
    const u = r.usage;
    assert.ok(u.prompt_tokens > prevPrompt, 'prompts grow');
    if (turn > 0) {
      assert.ok(
        u.prompt_tokens_details.cached_tokens >= prevPrompt - PAGE,
        `turn ${turn}: cached ${u.prompt_tokens_details.cached_tokens} < previous prompt ${prevPrompt} - ${PAGE}`,
      );
    }
    prevPrompt = u.prompt_tokens;
    const m = r.choices[0].message;
    const id = `call_${turn}`;
    messages.push({
      role: 'assistant',
      content: m.content ?? '',
      tool_calls: [{ id, type: 'function', function: { name: 'read_file', arguments: JSON.stringify({ path: `src/f${turn}.c` }) } }],
    });
    messages.push({ role: 'tool', tool_call_id: id, content: `int f${turn}(void) { return ${turn}; }\n`.repeat(1 + (turn % 3)) });
  }
});

test('a request cancelled mid-prefill keeps its committed pages', async () => {
  // ~2.9k tokens of text: prefill takes a few seconds on the CPU
  const words = [];
  for (let i = 0; i < 600; i++) words.push(`w${(i * 7919) % 10007}`);
  const content = words.join(' ');
  const ac = new AbortController();
  const stream = await srv.client.chat.completions.create(
    { model: 'm', messages: [{ role: 'user', content }], max_tokens: 4, stream: true },
    { signal: ac.signal },
  );
  setTimeout(() => ac.abort(), 200);
  try {
    for await (const _ of stream) {
      // the first token may arrive only after the whole prefill
    }
  } catch {}
  await sleep(200);
  const r = await srv.client.chat.completions.create({
    model: 'm',
    messages: [{ role: 'user', content }],
    max_tokens: 4,
  });
  const cached = r.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= PAGE, `re-sent prompt reused ${cached} tokens`);
  assert.ok(/reused \d+/.test(srv.log()), 'per-request log line reports reuse');
});
