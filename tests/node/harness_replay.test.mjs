// harness_replay.test.mjs — request bodies and headers shaped like the ones
// current Claude Code and Codex CLI send (issue 13, item 5), replayed as
// multi-turn, append-only conversations against a real nightshift serve:
// every request answers 200, every streamed event parses and comes in a
// valid order, and every turn reuses the previous turn's prompt from the
// prefix cache, read from the API's own usage fields (Anthropic
// cache_read_input_tokens, Responses input_tokens_details.cached_tokens).
//
// Claude Code asks for max_tokens 32000; the random-weight test model never
// stops by itself, so each main-loop turn is read up to its first deltas and
// then interrupted (as a user pressing Esc does): message_start already
// carries the usage, and the interrupted request's prompt stays cached. One
// short request (Claude Code's own small side requests use a few tokens) is
// read to message_stop to check the whole sequence.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startServer } from './server.mjs';

const PAGE = 16;
const KEY = 'sk-harness';
let srv;
before(async () => {
  srv = await startServer({ args: ['--page-size', String(PAGE), '--api-key', KEY] });
});
after(async () => {
  const r = await srv?.stop();
  assert.equal(r?.code, 0, 'server exit status after SIGTERM');
});

// Reads an SSE body; calls onEvent(name, data) per event (comments are
// keep-alives and skipped); onEvent returns true to stop reading.
async function readSSE(res, onEvent) {
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let name = null;
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue;
        if (line.startsWith('event: ')) name = line.slice(7);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (!data.length) continue;
      const obj = JSON.parse(data.join('\n')); // every event must parse
      if (onEvent(name, obj)) {
        await reader.cancel();
        return;
      }
    }
  }
  assert.equal(buf.trim(), '', 'no partial event at the end');
}

const ccHeaders = {
  'content-type': 'application/json',
  accept: 'application/json',
  'x-api-key': KEY,
  'anthropic-version': '2023-06-01',
  'anthropic-beta': 'claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,fine-grained-tool-streaming-2025-05-14',
  'anthropic-dangerous-direct-browser-access': 'true',
  'x-app': 'cli',
  'user-agent': 'claude-cli/2.0.0 (external, cli)',
};

const draft7 = 'http://json-schema.org/draft-07/schema#';
const ccTools = [
  {
    name: 'Bash',
    description: 'Executes a given bash command in a persistent shell session.',
    input_schema: {
      $schema: draft7,
      type: 'object',
      properties: { command: { type: 'string', description: 'The command to execute' }, timeout: { type: 'number' } },
      required: ['command'],
      additionalProperties: false,
    },
  },
  {
    name: 'Read',
    description: 'Reads a file from the local filesystem.',
    input_schema: {
      $schema: draft7,
      type: 'object',
      properties: { file_path: { type: 'string' }, offset: { type: 'number' }, limit: { type: 'number' } },
      required: ['file_path'],
      additionalProperties: false,
    },
  },
  { type: 'web_search_20250305', name: 'web_search', max_uses: 8 },
];

function ccBody(messages, maxTokens) {
  return {
    model: 'claude-sonnet-4-5-20250929',
    messages,
    system: [
      { type: 'text', text: "You are Claude Code, Anthropic's official CLI for Claude.", cache_control: { type: 'ephemeral' } },
      {
        type: 'text',
        text: 'You are an interactive CLI tool that helps users with software engineering tasks.\n# Tone and style\nBe concise.',
        cache_control: { type: 'ephemeral' },
      },
    ],
    tools: ccTools,
    metadata: { user_id: 'user_0123abcd_account__session_4567ef' },
    max_tokens: maxTokens,
    thinking: { type: 'adaptive' },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    output_config: { effort: 'medium' },
    stream: true,
  };
}

async function postCC(body) {
  const res = await fetch(srv.base + '/v1/messages?beta=true', { method: 'POST', headers: ccHeaders, body: JSON.stringify(body) });
  assert.equal(res.status, 200, `status ${res.status}: ${res.status === 200 ? '' : await res.text()}`);
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  assert.equal(res.headers.get('x-nightshift-ignored-tools'), 'web_search');
  return res;
}

test('Claude Code: streamed /v1/messages?beta=true turns hit the prefix cache', async () => {
  const messages = [
    {
      role: 'user',
      content: [
        { type: 'text', text: '<system-reminder>\nThis is a reminder that your todo list is empty.\n</system-reminder>' },
        { type: 'text', text: 'The build fails; find out why.', cache_control: { type: 'ephemeral' } },
      ],
    },
  ];
  let prev = 0;
  for (let turn = 0; turn < 4; turn++) {
    const res = await postCC(ccBody(messages, 32000));
    let usage = null, text = '', deltas = 0;
    await readSSE(res, (name, ev) => {
      assert.equal(ev.type, name, 'the event name matches its type');
      if (name === 'message_start') usage = ev.message.usage;
      if (name === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
      if (name === 'content_block_delta') deltas++;
      return deltas >= 3; // interrupt: the model would write 32000 tokens
    });
    assert.ok(usage, 'message_start came first');
    const total = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;
    assert.ok(total > prev, 'prompts grow');
    if (turn > 0)
      assert.ok(usage.cache_read_input_tokens >= prev - PAGE, `turn ${turn}: cache_read ${usage.cache_read_input_tokens} < ${prev} - ${PAGE}`);
    prev = total;
    const id = `toolu_01${turn}abc`;
    messages.push({
      role: 'assistant',
      content: [
        { type: 'thinking', thinking: `Let me look at step ${turn}.`, signature: `EqQBCkYIBxgCKkD${turn}` },
        { type: 'text', text: text || '.' },
        { type: 'tool_use', id, name: 'Bash', input: { command: `make -C src/m${turn}` } },
      ],
    });
    messages.push({
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: id, content: `make: *** [m${turn}] Error ${turn + 1}`, is_error: true }],
    });
    if (turn === 1) messages.push({ role: 'system', content: 'The user changed the working directory to /src.' });
  }
  // a short request reads to the end: the whole event sequence
  const res = await postCC(ccBody(messages, 4));
  const names = [];
  let open = -1;
  await readSSE(res, (name, ev) => {
    names.push(name);
    if (name === 'content_block_start') {
      assert.equal(open, -1, 'one block at a time');
      open = ev.index;
    }
    if (name === 'content_block_delta') assert.equal(ev.index, open);
    if (name === 'content_block_stop') {
      assert.equal(ev.index, open);
      open = -1;
    }
    if (name === 'message_delta') {
      assert.equal(ev.delta.stop_reason, 'max_tokens');
      assert.equal(ev.usage.output_tokens, 4);
      assert.ok(ev.usage.cache_read_input_tokens >= prev - PAGE);
    }
    return false;
  });
  assert.deepEqual(names.slice(0, 2), ['message_start', 'ping']);
  assert.deepEqual(names.slice(-2), ['message_delta', 'message_stop']);
  assert.ok(srv.alive());
});

const cxHeaders = {
  'content-type': 'application/json',
  accept: 'text/event-stream',
  authorization: `Bearer ${KEY}`,
  originator: 'codex_cli_rs',
  version: '0.50.0',
  session_id: '0199a213-81c0-7800-8aa1-bbab2a035a53',
  'openai-beta': 'responses=experimental',
};

const cxTools = [
  {
    type: 'function',
    name: 'shell',
    description: 'Runs a shell command and returns its output.',
    strict: false,
    parameters: {
      type: 'object',
      properties: { command: { type: 'array', items: { type: 'string' } }, workdir: { type: 'string' }, timeout_ms: { type: 'number' } },
      required: ['command'],
      additionalProperties: false,
    },
  },
  {
    type: 'namespace',
    name: 'mcp__files',
    description: 'Tools of the files MCP server',
    tools: [
      { type: 'function', name: 'list_dir', description: 'List a directory', parameters: { type: 'object', properties: { path: { type: 'string' } } } },
    ],
  },
  {
    type: 'custom',
    name: 'apply_patch',
    description: 'Use the `apply_patch` tool to edit files.',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF' },
  },
  { type: 'web_search' },
  { type: 'tool_search' },
];

function cxBody(input) {
  return {
    model: 'gpt-5-codex',
    instructions: undefined,
    input,
    tools: cxTools,
    tool_choice: 'auto',
    parallel_tool_calls: false,
    reasoning: { effort: 'medium', summary: 'auto' },
    store: false,
    stream: true,
    include: ['reasoning.encrypted_content'],
    prompt_cache_key: '0199a213-81c0-7800-8aa1-bbab2a035a53',
    client_metadata: { originator: 'codex_cli_rs' },
    text: { verbosity: 'low' },
    max_output_tokens: 8,
  };
}

test('Codex: streamed /v1/responses turns hit the prefix cache', async () => {
  const input = [
    { type: 'message', id: 'msg_dev0', role: 'developer', content: [{ type: 'input_text', text: 'You are Codex, a coding agent.' }] },
    { type: 'message', id: 'msg_env0', role: 'user', content: [{ type: 'input_text', text: '<environment_context>\n  <cwd>/src</cwd>\n</environment_context>' }] },
    { type: 'message', id: 'msg_usr0', role: 'user', content: [{ type: 'input_text', text: 'Fix the failing test.' }] },
  ];
  let prev = 0;
  for (let turn = 0; turn < 4; turn++) {
    const res = await fetch(srv.base + '/v1/responses', { method: 'POST', headers: cxHeaders, body: JSON.stringify(cxBody(input)) });
    assert.equal(res.status, 200, await (res.status === 200 ? '' : res.text()));
    assert.equal(res.headers.get('x-nightshift-ignored-tools'), 'web_search,tool_search');
    let final = null, seq = 0;
    const open = new Set();
    await readSSE(res, (name, ev) => {
      assert.equal(ev.type, name);
      assert.equal(ev.sequence_number, seq++);
      if (name === 'response.output_item.added') open.add(ev.output_index);
      if (name === 'response.output_item.done') open.delete(ev.output_index);
      if (name === 'response.completed' || name === 'response.incomplete') final = ev.response;
      return false;
    });
    assert.ok(final, 'the stream ends with the response');
    assert.equal(open.size, 0, 'every item that was added is done');
    const u = final.usage;
    assert.ok(u.input_tokens > prev, 'prompts grow');
    if (turn > 0)
      assert.ok(u.input_tokens_details.cached_tokens >= prev - PAGE, `turn ${turn}: cached ${u.input_tokens_details.cached_tokens} < ${prev} - ${PAGE}`);
    prev = u.input_tokens;
    // Codex echoes the output items (ids kept; reasoning with content null
    // and its encrypted_content), then the call it ran and its output
    for (const o of final.output) input.push(o.type === 'reasoning' ? { ...o, content: null } : o);
    input.push({ type: 'reasoning', id: `rs_x${turn}`, summary: [], content: null, encrypted_content: 'gAAAAB-opaque' });
    const call_id = `call_${turn}`;
    if (turn % 2 === 0) {
      input.push({ type: 'function_call', id: `fc_${turn}`, call_id, name: 'shell', arguments: JSON.stringify({ command: ['ls', `d${turn}`] }) });
      input.push({ type: 'function_call_output', call_id, output: `file${turn}.c` });
    } else {
      input.push({ type: 'custom_tool_call', id: `ctc_${turn}`, call_id, name: 'apply_patch', input: `*** Begin Patch\n*** Update File: f${turn}.c\n*** End Patch` });
      input.push({ type: 'custom_tool_call_output', call_id, output: 'Done!' });
    }
  }
});
