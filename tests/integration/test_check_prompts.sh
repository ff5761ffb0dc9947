#!/usr/bin/env bash
# test_check_prompts.sh — `nightshift check-prompts` on crafted recordings
# (written here, in the serve --record format): one session per kind of
# cache break, each attributed correctly, with a prefill cost; an
# append-only session reports none; a redacted recording is refused.
# Renders with tiny-qwen3's real chat template and tokenizer (Qwen3's
# template drops the reasoning of assistant turns before the last user
# message: the template re-render case).
source "$(dirname "$0")/common.bash"

REC="$TMP/rec.jsonl"
# the generated ids a crafted turn's output stands for (what the cache held)
ids_of() { printf '%s' "$1" | "$NS_BIN" tokenize --model "$MODEL"; }
REASONING_IDS=$(ids_of $'<think>\nI should greet.\n</think>\n\nHello!<|im_end|>')
SPACES_IDS=$(ids_of $'  Sure, here it is.<|im_end|>')

REASONING_IDS="$REASONING_IDS" SPACES_IDS="$SPACES_IDS" node - "$REC" <<'EOF' || fail "writing the recording"
const fs = require('fs');
const out = process.argv[2];
let t = 1796000000, lines = [];
const sys = (s) => ({role: 'system', content: s});
const u = (s) => ({role: 'user', content: s});
const a = (s, extra) => Object.assign({role: 'assistant', content: s}, extra || {});
const tool = {type: 'function', function: {name: 'read', description: 'read a file', parameters: {type: 'object', properties: {path: {type: 'string'}}}}};
const tool2 = {type: 'function', function: {name: 'write', description: 'write a file', parameters: {type: 'object', properties: {path: {type: 'string'}}}}};
function rec(body, output) {
  const r = {v: 1, t: t++, endpoint: '/v1/chat/completions', status: 200, stream: false, redacted: false,
             prompt_tokens: 0, cached_tokens: 0, request: Object.assign({model: 'm', max_tokens: 8}, body)};
  if (output) r.output = output;
  lines.push(JSON.stringify(r));
}
// 1. append-only: the answers go back exactly as generated
{ const m = [sys('You are helpful.'), u('append: list the files')];
  rec({messages: m}, {content: 'a.txt b.txt', reasoning: ''});
  m.push(a('a.txt b.txt'), u('append: now read a.txt')); rec({messages: m}, {content: 'It says hi.', reasoning: ''});
  m.push(a('It says hi.'), u('append: thanks')); rec({messages: m}); }
// 2. system prompt changed (a date in it)
{ rec({messages: [sys('Today is Monday. Be brief.'), u('system: hello')]}, {content: 'Hi.', reasoning: ''});
  rec({messages: [sys('Today is Tuesday. Be brief.'), u('system: hello'), a('Hi.'), u('more')]}); }
// 3. tool list changed
{ rec({messages: [sys('Agent.'), u('tools: start')], tools: [tool]}, {content: 'Ok.', reasoning: ''});
  rec({messages: [sys('Agent.'), u('tools: start'), a('Ok.'), u('go on')], tools: [tool, tool2]}); }
// 4. message 3 edited (an earlier instruction rewritten by the client)
{ rec({messages: [sys('Agent.'), u('edit: a task'), a('Ok.'), u('fix the bug in main.c')]}, {content: 'Done.', reasoning: ''});
  rec({messages: [sys('Agent.'), u('edit: a task'), a('Ok.'), u('fix the bug in util.c'), a('Done.'), u('and test it')]}); }
// 5. reasoning stripped: the generated <think> block is not sent back
{ rec({messages: [u('reason: say hello')]}, {content: 'Hello!', reasoning: 'I should greet.', ids: JSON.parse(process.env.REASONING_IDS)});
  rec({messages: [u('reason: say hello'), a('Hello!'), u('again')]}); }
// 6. whitespace trimmed at the answer boundary (the answer's leading spaces)
{ rec({messages: [u('trim: show it')]}, {content: '  Sure, here it is.', reasoning: '', ids: JSON.parse(process.env.SPACES_IDS)});
  rec({messages: [u('trim: show it'), a('Sure, here it is.'), u('next')]}); }
// 7. template re-render: append-only messages, but the template drops the
// reasoning of the tool-calling turn once a new user message follows
{ const call = {id: 'call_1', type: 'function', function: {name: 'read', arguments: '{"path": "a.txt"}'}};
  const m = [u('rerender: read a.txt'), a('', {reasoning_content: 'I need the file.', tool_calls: [call]}),
             {role: 'tool', tool_call_id: 'call_1', content: 'hello'}];
  rec({messages: m, tools: [tool]});
  rec({messages: m.concat([a('It says hello.'), u('thanks')]), tools: [tool]}); }
fs.writeFileSync(out, lines.join('\n') + '\n');
EOF

"$NS_BIN" check-prompts "$REC" --model "$MODEL" --json "$TMP/out.json" >"$TMP/out.txt" 2>&1 ||
  { cat "$TMP/out.txt"; fail "check-prompts failed"; }
cat "$TMP/out.txt"

# session -> [breaks, reason kinds of turn 1, prefill of turn 1, message]
check() { # NAME SESSION_FIRST_RECORD EXPECTED_KIND EXPECTED_MESSAGE(or any)
  local got
  got=$(node -e '
    const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
    const s = j.sessions.find(s => s.turn_results[0].record === +process.argv[2]);
    if (!s) { console.log("no session"); process.exit(0); }
    const t = s.turn_results[1];
    console.log([s.turns, s.breaks, t.append_only, (t.reasons || []).map(r => r.kind).join(","),
                 (t.reasons || []).map(r => r.message).join(","), t.prefill_tokens > 0].join("|"));' "$TMP/out.json" "$2")
  IFS='|' read -r turns breaks app kinds msgs costly <<<"$got"
  [ "$turns" = 2 ] || fail "$1: session has $turns turns ($got)"
  [ "$breaks" = 1 ] && [ "$app" = false ] || fail "$1: not reported as a break ($got)"
  [ "$kinds" = "$3" ] || fail "$1: reasons '$kinds', want '$3' ($got)"
  [ "$4" = any ] || [ "$msgs" = "$4" ] || fail "$1: message '$msgs', want '$4' ($got)"
  [ "$costly" = true ] || fail "$1: no prefill cost ($got)"
}
# records are numbered from 1 in file order
check "system prompt" 4 system_prompt_changed 0
check "tools" 6 tools_changed ""
check "edited message" 8 message_edited 3
check "reasoning" 10 reasoning_stripped 1
check "whitespace" 12 whitespace_trimmed 1
check "template" 14 template_rerender ""

append=$(node -e '
  const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
  const s = j.sessions.find(s => s.turn_results[0].record === 1);
  console.log(s.turns, s.breaks, s.turn_results.slice(1).every(t => t.append_only && t.reasons.length === 0));' "$TMP/out.json")
[ "$append" = "3 0 true" ] || fail "append-only session: '$append', want '3 0 true'"
grep -qF 'system_prompt_changed: at byte 9: "Today is " then -"Mon" +"Tues"' "$TMP/out.txt" ||
  fail "the system prompt diff does not show the differing text"
grep -qF 'message_edited: message 3 (user): at byte' "$TMP/out.txt" && grep -qF -- '-"main" +"util"' "$TMP/out.txt" ||
  fail "the edit diff does not show the differing text"
total=$(node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(j.sessions_count, j.breaks)' "$TMP/out.json")
[ "$total" = "7 6" ] || fail "totals '$total', want '7 6'"

# a redacted recording is refused, saying why
node -e 'const fs=require("fs");const l=fs.readFileSync(process.argv[1],"utf8").split("\n")[0];const r=JSON.parse(l);r.redacted=true;fs.writeFileSync(process.argv[2],JSON.stringify(r)+"\n")' "$REC" "$TMP/red.jsonl"
if "$NS_BIN" check-prompts "$TMP/red.jsonl" --model "$MODEL" >"$TMP/red.txt" 2>&1; then fail "a redacted recording was checked"; fi
grep -q "redacted" "$TMP/red.txt" || fail "the refusal does not say the recording is redacted: $(cat "$TMP/red.txt")"
# a bad line names itself
printf '{"v":1}\nnot json\n' >"$TMP/bad.jsonl"
if "$NS_BIN" check-prompts "$TMP/bad.jsonl" --model "$MODEL" >"$TMP/bad.txt" 2>&1; then fail "a bad recording was accepted"; fi
grep -q ":2:" "$TMP/bad.txt" || fail "the error does not name line 2: $(cat "$TMP/bad.txt")"
echo "ok - check-prompts attributes each kind of break; append-only session clean; redacted refused"
