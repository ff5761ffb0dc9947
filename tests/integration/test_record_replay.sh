#!/usr/bin/env bash
# test_record_replay.sh — serve --record, nightshift replay, redaction and
# rotation against the real server on 127.0.0.1:
#  1. a scripted run of append-only sessions (chat, chat streamed,
#     completions, Anthropic Messages; greedy), a Responses request and a
#     400 is recorded: one line per request,
#     with status, TTFT, prompt/cached/output tokens;
#     check-prompts on that recording puts each later turn's divergence
#     exactly at the cached tokens the server reported;
#  2. replayed one session at a time against a fresh server with the same
#     flags: every request gets the recorded status and the recorded
#     cached tokens (--expect-cached);
#  3. replayed with sessions in parallel at the recorded pace, every
#     request streamed (--stream: TTFT for all), against another fresh
#     server: turns after the first reuse exactly what was recorded (a
#     first turn may share the template's first tokens with another
#     session's, depending on which ran first);
#  4. --record-redact: no message text reaches the file, replay refuses it;
#  5. --record-max-bytes/--record-keep rotate, keeping N files.
source "$(dirname "$0")/common.bash"

FLAGS=(--no-ssd-cache --ram-cache 0)
REC="$TMP/rec"
start_server "${FLAGS[@]}" --record "$REC"

# 1. the scripted run (chat, chat streamed, completions, Anthropic Messages,
# Responses): sessions one after another, so the recorded cached
# tokens do not depend on which session's first prompt was cached first
node - "$BASE" <<'EOF' || fail "the scripted run failed"
const base = process.argv[2];
async function post(path, body) {
  const r = await fetch(base + path, {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  return {status: r.status, text: await r.text()};
}
async function chat(body) {
  const r = await post('/v1/chat/completions', body);
  if (r.status !== 200) throw new Error('status ' + r.status + ': ' + r.text);
  if (!body.stream) return JSON.parse(r.text).choices[0].message.content;
  let out = '';
  for (const l of r.text.split('\n'))
    if (l.startsWith('data: {')) { const j = JSON.parse(l.slice(6)); if (j.choices[0]) out += j.choices[0].delta.content || ''; }
  return out;
}
async function session(name, stream) {
  const m = [{role: 'system', content: `${name} agent. ` + 'Follow the rules. '.repeat(8)}];
  for (let t = 0; t < 3; t++) {
    m.push({role: 'user', content: `${name} turn ${t}: ` + 'read this file content. '.repeat(6 + t)});
    m.push({role: 'assistant', content: await chat({model: 'x', messages: m, max_tokens: 12, temperature: 0, stream})});
  }
}
async function completions(name) {
  let p = `${name} story: ` + 'once upon a time '.repeat(10);
  for (let t = 0; t < 3; t++) {
    const r = await post('/v1/completions', {model: 'x', prompt: p, max_tokens: 10, temperature: 0});
    if (r.status !== 200) throw new Error('status ' + r.status);
    p += JSON.parse(r.text).choices[0].text + ' and then '.repeat(5);
  }
}
async function messages(name) { // Anthropic Messages: a whole answer, then a streamed turn
  const m = [{role: 'user', content: `${name}: ` + 'list the files in this directory. '.repeat(5)}];
  const sys = `${name} helper. ` + 'Be careful. '.repeat(6);
  const r = await post('/v1/messages', {model: 'x', max_tokens: 8, temperature: 0, system: sys, messages: m});
  if (r.status !== 200) throw new Error('messages status ' + r.status + ': ' + r.text);
  m.push({role: 'assistant', content: JSON.parse(r.text).content[0].text}, {role: 'user', content: 'and the hidden ones'});
  const s = await post('/v1/messages', {model: 'x', max_tokens: 8, temperature: 0, system: sys, messages: m, stream: true});
  if (s.status !== 200 || !s.text.includes('message_stop')) throw new Error('messages stream: ' + s.text);
  const q = await post('/v1/responses', {model: 'x', max_output_tokens: 8, temperature: 0, instructions: 'Be brief.', input: `${name}: hello`});
  if (q.status !== 200) throw new Error('responses status ' + q.status + ': ' + q.text);
}
await session('alpha', false);
await session('beta', true);
await completions('gamma');
await messages('delta');
const bad = await post('/v1/chat/completions', {model: 'x', messages: [{role: 'user', content: 'bad'}], max_tokens: -1});
if (bad.status !== 400) throw new Error('want a 400, got ' + bad.status);
EOF
# records are written by a thread of their own: wait for the 13th line
for _ in $(seq 1 250); do [ "$(wc -l <"$REC/requests.jsonl" 2>/dev/null || echo 0)" -ge 13 ] && break; sleep 0.02; done
[ "$(wc -l <"$REC/requests.jsonl")" = 13 ] || fail "want 13 records, got $(wc -l <"$REC/requests.jsonl")"
check=$(node -e '
  const L = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
  const ok = L.filter(r => r.status === 200), bad = L.filter(r => r.status === 400);
  const errs = [];
  if (ok.length !== 12 || bad.length !== 1) errs.push(`statuses ${L.map(r => r.status)}`);
  for (const r of ok) {
    if (!(r.ttft_s > 0 && r.duration_s >= r.ttft_s)) errs.push("ttft " + r.ttft_s);
    if (!(r.prompt_tokens > 0 && r.output_tokens > 0 && r.finish_reason)) errs.push("tokens " + JSON.stringify(r));
    if (!r.request || !r.request.model || !r.output || !Array.isArray(r.output.ids)) errs.push("body/output");
    if (r.cached_tokens_by_tier.device + r.cached_tokens_by_tier.ram + r.cached_tokens_by_tier.ssd !== r.cached_tokens) errs.push("tiers");
  }
  if (bad[0] && !(bad[0].error && bad[0].error.code === "invalid_value" && bad[0].request.max_tokens === -1)) errs.push("400 record");
  if (L.filter(r => r.stream).length !== 4) errs.push("stream flags");
  if (L.filter(r => r.endpoint === "/v1/messages").length !== 2 || L.filter(r => r.endpoint === "/v1/responses").length !== 1) errs.push("endpoints");
  const reused = ok.filter(r => r.cached_tokens >= 40).length; // the seven later turns
  if (reused < 7) errs.push("later turns reuse little: " + ok.map(r => r.cached_tokens));
  console.log(errs.length ? errs.join("; ") : "ok");' "$REC/requests.jsonl")
[ "$check" = ok ] || fail "records: $check"
metric=$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_record_lines_total \([0-9]*\)$/\1/p')
[ "$metric" = 13 ] || fail "nightshift_record_lines_total is '$metric', want 13"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null

# check-prompts on the real run: where it says each later turn diverges from
# what the previous turn left in the cache (its prompt and generated ids) is
# exactly the cached tokens the server reported for that turn
"$NS_BIN" check-prompts "$REC/requests.jsonl" --model "$MODEL" --json "$TMP/cp.json" >"$TMP/cp.txt" 2>&1 ||
  { cat "$TMP/cp.txt"; fail "check-prompts on the recording failed"; }
got=$(node -e '
  const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
  const later = j.sessions.flatMap(s => s.turn_results.slice(1));
  const bad = later.filter(t => t.diverge_at !== t.recorded_cached_tokens);
  console.log(later.length, bad.length ? JSON.stringify(bad) : "agree");' "$TMP/cp.json")
[ "$got" = "7 agree" ] || { cat "$TMP/cp.txt"; fail "check-prompts vs the server's cached tokens: $got"; }

# 2. replay one session at a time against a fresh server: same statuses, same cached tokens
start_server "${FLAGS[@]}"
"$NS_BIN" replay "$REC/requests.jsonl" --url "$BASE" --speed max --concurrency 1 --expect-cached \
  --json "$TMP/replay1.json" >"$TMP/replay1.txt" 2>&1 || { cat "$TMP/replay1.txt"; fail "replay (sequential) failed"; }
cat "$TMP/replay1.txt"
got=$(node -e '
  const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
  const r = j.requests, s = j.summary;
  console.log(s.requests, s.sessions, s.failed, s.cached_mismatches, r.every(x => x.cached_matches_recording),
              r.filter(x => x.stream).every(x => x.ttft_s > 0 && x.decode_tok_s > 0), s.ttft_s.n, s.cached_tokens > 0);' "$TMP/replay1.json")
[ "$got" = "13 6 0 0 true true 4 true" ] || fail "sequential replay: '$got', want '13 6 0 0 true true 4 true'"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null

# 3. sessions in parallel at the recorded pace (recorded again, to see what was sent)
start_server "${FLAGS[@]}" --record "$TMP/rec2"
"$NS_BIN" replay "$REC/requests.jsonl" --url "$BASE" --stream --model renamed-model --json "$TMP/replay2.json" \
  >"$TMP/replay2.txt" 2>&1 ||
  { cat "$TMP/replay2.txt"; fail "replay (parallel) failed"; }
got=$(node -e '
  const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
  const later = j.requests.filter(x => x.turn > 0), first = j.requests.filter(x => x.turn === 0 && x.status === 200);
  console.log(j.summary.failed, j.concurrency, later.length, later.every(x => x.cached_matches_recording),
              first.every(x => x.cached_tokens <= 8),
              j.requests.filter(x => x.status === 200).every(x => x.stream && x.ttft_s > 0 && x.output_tokens > 0));' "$TMP/replay2.json")
[ "$got" = "0 6 7 true true true" ] || { cat "$TMP/replay2.txt"; fail "parallel replay: '$got', want '0 6 7 true true true'"; }
# the bodies sent are the recorded ones, but for "model" and "stream"
for _ in $(seq 1 250); do [ "$(wc -l <"$TMP/rec2/requests.jsonl" 2>/dev/null || echo 0)" -ge 13 ] && break; sleep 0.02; done
got=$(node -e '
  const rd = f => require("fs").readFileSync(f, "utf8").trim().split("\n").map(JSON.parse);
  const a = rd(process.argv[1]), b = rd(process.argv[2]);
  const key = r => { const q = Object.assign({}, r.request); delete q.model; delete q.stream; delete q.stream_options; return JSON.stringify(q); };
  const ka = a.map(key).sort(), kb = b.map(key).sort();
  console.log(b.length, JSON.stringify(ka) === JSON.stringify(kb), b.every(r => r.request.model === "renamed-model" && r.request.stream === true));' \
  "$REC/requests.jsonl" "$TMP/rec2/requests.jsonl")
[ "$got" = "13 true true" ] || fail "the replayed bodies differ from the recorded ones: $got"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null

# 4. redaction: the texts never reach the file; replay refuses the recording
start_server "${FLAGS[@]}" --record "$TMP/red" --record-redact
post /v1/chat/completions '{"model":"x","messages":[{"role":"system","content":"sekrit-system-7781"},{"role":"user","content":"the password is hunter2-9931"}],"max_tokens":4}'
[ "$STATUS" = 200 ] || fail "redacted run: status $STATUS"
post /v1/completions '{"model":"x","prompt":"completion-secret-4471","max_tokens":4}'
[ "$STATUS" = 200 ] || fail "redacted completion: status $STATUS"
for _ in $(seq 1 250); do [ "$(wc -l <"$TMP/red/requests.jsonl" 2>/dev/null || echo 0)" -ge 2 ] && break; sleep 0.02; done
grep -q "hunter2\|sekrit\|completion-secret" "$TMP/red/requests.jsonl" && fail "a redacted recording holds the text"
red=$(node -e '
  const L = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
  const m = L[0].request.messages, p = L[1].request.prompt;
  console.log(L.every(r => r.redacted), m[1].role, m[1].content.redacted_tokens > 0, m[1].content.xxh3.length,
              p.redacted_tokens > 0, L[0].output.ids === undefined, typeof L[0].output.content.xxh3);' "$TMP/red/requests.jsonl")
[ "$red" = "true user true 32 true true string" ] || fail "redacted records: '$red'"
if "$NS_BIN" replay "$TMP/red/requests.jsonl" --url "$BASE" >"$TMP/red.txt" 2>&1; then fail "replay accepted a redacted recording"; fi
grep -q "redacted recording" "$TMP/red.txt" || fail "replay does not say why: $(cat "$TMP/red.txt")"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null

# 5. rotation: ~700-byte records, files of at most 2 KiB, 2 rotated files kept
start_server "${FLAGS[@]}" --record "$TMP/rot" --record-max-bytes 2048 --record-keep 2
for i in $(seq 1 12); do
  post /v1/completions "{\"model\":\"x\",\"prompt\":\"rotation $i\",\"max_tokens\":2}"
  [ "$STATUS" = 200 ] || fail "rotation run: status $STATUS"
done
for _ in $(seq 1 250); do
  [ "$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_record_lines_total \([0-9]*\)$/\1/p')" = 12 ] && break; sleep 0.02
done
ls "$TMP/rot" >"$TMP/rot.ls"
[ "$(cat "$TMP/rot.ls" | tr '\n' ' ')" = "requests.jsonl requests.jsonl.1 requests.jsonl.2 " ] ||
  fail "rotated files: $(cat "$TMP/rot.ls" | tr '\n' ' ')"
for f in "$TMP"/rot/*; do [ "$(stat -c %s "$f")" -le 2048 ] || fail "$f is over 2048 bytes"; done
rots=$(curl -s "$BASE/metrics" | sed -n 's/^nightshift_record_rotations_total \([0-9]*\)$/\1/p')
[ "${rots:-0}" -ge 3 ] || fail "rotations: '$rots'"
# the newest lines are in requests.jsonl, older ones in .1; each line whole
last=$(tail -1 "$TMP/rot/requests.jsonl" | node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>console.log(JSON.parse(d).request.prompt))')
[ "$last" = "rotation 12" ] || fail "the last record is '$last'"
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
# a restart appends to the current file
n0=$(wc -l <"$TMP/rot/requests.jsonl")
start_server "${FLAGS[@]}" --record "$TMP/rot" --record-max-bytes 1M
post /v1/completions '{"model":"x","prompt":"after restart","max_tokens":2}'
for _ in $(seq 1 250); do [ "$(wc -l <"$TMP/rot/requests.jsonl")" -gt "$n0" ] && break; sleep 0.02; done
[ "$(wc -l <"$TMP/rot/requests.jsonl")" = $((n0 + 1)) ] || fail "a restart did not append"
echo "ok - record, replay (same cached tokens), redaction, rotation"
