// structured.test.mjs — structured output is enforced by a grammar, not
// hoped for: on the random-weight tiny-qwen3 model (whose unconstrained
// output is noise), 50 completions sampled at temperature 1 for each schema
// must all parse and validate against the schema — checked by ajv, an
// independent JSON Schema validator — and forced tool calls ("required",
// a named function) must always be valid calls to an offered (the named)
// tool with arguments valid against its parameters. Also: unsupported
// schema keywords are a 400 naming them, json_object answers are objects,
// and a constrained stream finishes the same way.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import { startServer } from './server.mjs';

const N = 50;
let srv;
const ajv = new Ajv({ strict: false, allErrors: true });

before(async () => {
  srv = await startServer({ args: ['--max-running', '50'] });
});
after(async () => {
  await srv?.stop();
});

const SCHEMAS = {
  nested_objects: {
    type: 'object',
    properties: {
      user: {
        type: 'object',
        properties: { name: { type: 'string', maxLength: 8 }, id: { type: 'integer', minimum: 1, maximum: 9999 } },
        required: ['name', 'id'],
        additionalProperties: false,
      },
      active: { type: 'boolean' },
    },
    required: ['user', 'active'],
    additionalProperties: false,
  },
  arrays: {
    type: 'object',
    properties: { tags: { type: 'array', items: { type: 'string', maxLength: 5 }, minItems: 1, maxItems: 3 } },
    required: ['tags'],
    additionalProperties: false,
  },
  enums_and_numbers: {
    type: 'object',
    properties: {
      color: { enum: ['red', 'green', 'blue'] },
      score: { type: 'number' },
      count: { type: 'integer', minimum: -10, maximum: 10 },
    },
    required: ['color', 'score', 'count'],
    additionalProperties: false,
  },
  strings_with_escapes: {
    type: 'object',
    properties: { s: { type: 'string', minLength: 2, maxLength: 10 }, code: { type: 'string', pattern: '^[a-z]{1,4}-\\d{1,3}$' } },
    required: ['s', 'code'],
    additionalProperties: false,
  },
  optional_fields: {
    type: 'object',
    properties: {
      a: { type: 'integer', minimum: 0, maximum: 99 },
      b: { type: 'string', maxLength: 4 },
      c: { type: 'null' },
      d: { type: ['boolean', 'null'] },
    },
    required: [],
    additionalProperties: false,
  },
  any_of: {
    anyOf: [
      { type: 'integer', minimum: 0, maximum: 100 },
      { type: 'string', maxLength: 6 },
      { type: 'array', items: { type: 'boolean' }, maxItems: 2 },
    ],
  },
  refs: {
    $defs: {
      pt: {
        type: 'object',
        properties: { x: { type: 'integer', minimum: 0, maximum: 9 }, y: { type: 'integer', minimum: 0, maximum: 9 } },
        required: ['x', 'y'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: { from: { $ref: '#/$defs/pt' }, to: { $ref: '#/$defs/pt' } },
    required: ['from', 'to'],
    additionalProperties: false,
  },
};

function chat(extra, i) {
  return srv.post('/v1/chat/completions', {
    model: 'tiny-qwen3',
    messages: [{ role: 'user', content: `Give me item ${i}.` }],
    temperature: 1,
    seed: 1000 + i,
    max_tokens: 400,
    enable_thinking: false,
    ...extra,
  });
}

for (const [name, schema] of Object.entries(SCHEMAS)) {
  test(`json_schema ${name}: ${N} samples at temperature 1 all validate`, async () => {
    const validate = ajv.compile(schema);
    const rs = await Promise.all(
      Array.from({ length: N }, (_, i) =>
        chat({ response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } } }, i),
      ),
    );
    const outs = new Set();
    for (const [i, r] of rs.entries()) {
      assert.equal(r.status, 200, r.text);
      const ch = r.json.choices[0];
      assert.equal(ch.finish_reason, 'stop', `sample ${i} did not finish: ${JSON.stringify(ch)}`);
      let v;
      assert.doesNotThrow(() => (v = JSON.parse(ch.message.content)), `sample ${i} is not JSON: ${ch.message.content}`);
      assert.ok(validate(v), `sample ${i} ${JSON.stringify(v)}: ${ajv.errorsText(validate.errors)}`);
      outs.add(JSON.stringify(v));
    }
    // the samples really are samples, not one canned answer
    assert.ok(outs.size > 2, `only ${outs.size} distinct outputs`);
  });
}

test('json_object: samples are JSON objects', async () => {
  const rs = await Promise.all(
    Array.from({ length: 12 }, (_, i) => chat({ response_format: { type: 'json_object' }, max_tokens: 120 }, i)),
  );
  let finished = 0;
  for (const r of rs) {
    assert.equal(r.status, 200, r.text);
    const ch = r.json.choices[0];
    // keys and strings are unbounded: a random model may write one until
    // max_tokens, which ends the answer as 'length' (documented)
    if (ch.finish_reason === 'length') continue;
    finished++;
    const v = JSON.parse(ch.message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), ch.message.content);
  }
  assert.ok(finished >= 3, `only ${finished} of 12 finished`);
});

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather in a city',
      parameters: {
        $schema: 'http://json-schema.org/draft-07/schema#',
        type: 'object',
        properties: { city: { type: 'string', maxLength: 8 }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: -100, maximum: 100 }, b: { type: 'integer', minimum: -100, maximum: 100 } },
        required: ['a', 'b'],
        additionalProperties: false,
      },
    },
  },
];
const toolValidators = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));

function checkCalls(r, i, allowed) {
  assert.equal(r.status, 200, r.text);
  const ch = r.json.choices[0];
  assert.equal(ch.finish_reason, 'tool_calls', `sample ${i}: ${JSON.stringify(ch)}`);
  const calls = ch.message.tool_calls;
  assert.ok(Array.isArray(calls) && calls.length >= 1, `sample ${i}: no calls`);
  for (const c of calls) {
    assert.ok(allowed.includes(c.function.name), `sample ${i}: call to ${c.function.name}`);
    const args = JSON.parse(c.function.arguments);
    const v = toolValidators[c.function.name];
    assert.ok(v(args), `sample ${i} ${c.function.arguments}: ${ajv.errorsText(v.errors)}`);
  }
  return calls;
}

test(`tool_choice required: ${N} samples are valid calls to offered tools`, async () => {
  const rs = await Promise.all(
    Array.from({ length: N }, (_, i) =>
      // one in five may make parallel calls (up to 4: longer answers)
      chat({ tools: TOOLS, tool_choice: 'required', parallel_tool_calls: i % 5 === 0 ? undefined : false, max_tokens: 900 }, i),
    ),
  );
  const names = new Set();
  let parallel = 0;
  for (const [i, r] of rs.entries()) {
    const calls = checkCalls(r, i, ['get_weather', 'add']);
    if (i % 5 !== 0) assert.equal(calls.length, 1, `parallel_tool_calls false gave ${calls.length} calls`);
    else parallel = Math.max(parallel, calls.length);
    calls.forEach((c) => names.add(c.function.name));
  }
  assert.equal(names.size, 2, 'both tools get called across the samples');
  assert.ok(parallel > 1, 'with parallel calls allowed, some answer holds several');
});

test(`named tool_choice: ${N} samples call exactly that tool`, async () => {
  const rs = await Promise.all(
    Array.from({ length: N }, (_, i) =>
      chat({ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'add' } } }, i),
    ),
  );
  for (const [i, r] of rs.entries()) assert.equal(checkCalls(r, i, ['add']).length, 1);
});

test('a constrained stream finishes with valid JSON (openai client)', async () => {
  const schema = SCHEMAS.enums_and_numbers;
  const stream = await srv.client.chat.completions.create({
    model: 'tiny-qwen3',
    messages: [{ role: 'user', content: 'stream it' }],
    temperature: 1,
    seed: 7,
    max_tokens: 400,
    stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 's', schema, strict: true } },
    enable_thinking: false,
  });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  assert.ok(ajv.validate(schema, JSON.parse(text)), text);
});

test('unsupported schemas and conflicting options are a 400 naming the problem', async () => {
  const bad = [
    [{ type: 'object', properties: { e: { type: 'string', format: 'email' } } }, "'format' at #/properties/e"],
    [{ oneOf: [{ type: 'string' }] }, "'oneOf'"],
    [{ type: 'number', minimum: 0.5 }, "'minimum' is supported for type integer only"],
  ];
  for (const [schema, needle] of bad) {
    const r = await chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }, 0);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, 'response_format');
    assert.ok(r.json.error.message.includes(needle), r.json.error.message);
  }
  let r = await chat({ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 0);
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'response_format.json_schema.schema');
  r = await chat({ response_format: { type: 'json_object' }, tools: TOOLS, tool_choice: 'required' }, 0);
  assert.equal(r.status, 400);
  r = await chat({ response_format: { type: 'json_object' }, ignore_eos: true }, 0);
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'ignore_eos');
  r = await chat({ response_format: { type: 'yaml' } }, 0);
  assert.equal(r.status, 400);
  // the server keeps serving
  r = await chat({ max_tokens: 4 }, 0);
  assert.equal(r.status, 200);
});

test('completions: response_format constrains the raw text', async () => {
  const schema = SCHEMAS.refs;
  const rs = await Promise.all(
    Array.from({ length: 10 }, (_, i) =>
      srv.post('/v1/completions', {
        model: 'tiny-qwen3',
        prompt: `point ${i}`,
        temperature: 1,
        seed: i,
        max_tokens: 300,
        response_format: { type: 'json_schema', json_schema: { name: 'p', schema } },
      }),
    ),
  );
  for (const r of rs) {
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'stop');
    assert.ok(ajv.validate(schema, JSON.parse(r.json.choices[0].text)), r.json.choices[0].text);
  }
});
