#!/usr/bin/env bash
# test_bench.sh — `nightshift bench` against local servers (issue 15):
#  - two servers of the same model: the identity gate passes, the JSON has
#    a bootstrap CI for every compared metric, blocks alternate AB/BA with
#    distinct seeds, and the HTML report is one offline file;
#  - the same model with other weights (--dummy-weights): the gate fails
#    with reasons and every ratio is withheld, in the JSON and the report;
#  - a recording (serve --record) replays as a scenario;
#  - restart-resume is reported as skipped, with its reason;
#  - usage errors exit 2, an unreachable server exits 1.
source "$(dirname "$0")/common.bash"

start_server --no-ssd-cache
A=$BASE
start_server --no-ssd-cache
B=$BASE
# other weights, same shape and tokenizer (start_server always adds --model)
CLOG=$TMP/dummy.log
NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 --no-ssd-cache \
  --dummy-weights "$MODEL/config.json" >"$CLOG" 2>&1 &
SERVER_PIDS+=($!)
C=""
for _ in $(seq 1 1500); do
  p=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$CLOG" | head -1)
  [ -n "$p" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/health")" = 200 ] && { C=http://127.0.0.1:$p; break; }
  sleep 0.02
done
[ -n "$C" ] || { tail -5 "$CLOG"; fail "the --dummy-weights server did not start"; }

J=$TMP/ab.json
"$NS_BIN" bench --url "$A" --url "$B" --scenario cold-ttft-1k --requests 1 --blocks 5 --seed 7 \
  --json "$J" --html "$TMP/ab.html" >"$TMP/ab.out" 2>&1 || { cat "$TMP/ab.out"; fail "bench A/B failed"; }
# check FILE 'JS condition' 'what' ...: all the checks of one result in one node run
check() {
  local f=$1; shift
  local out
  out=$(node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const a = process.argv.slice(2);
for (let i = 0; i < a.length; i += 2) {
  let ok = false;
  try { ok = new Function("j", "return (" + a[i] + ")")(j); } catch (e) { ok = false; }
  if (ok !== true) { console.log(a[i + 1] + ": " + JSON.stringify(j).slice(0, 1500)); process.exit(1); }
}' "$f" "$@") || fail "$out"
}
check "$J" \
  'j.identity.verdict === "pass"' "same model: identity" \
  'j.comparison.withheld === false' "same model: comparison withheld" \
  'j.comparison.metrics.length === 2' "two compared metrics expected" \
  'j.comparison.metrics.every(m => !m.withheld && m.ci_lo > 0 && m.ci_lo <= m.ratio && m.ratio <= m.ci_hi && m.log_ratios.length === 5 && ["A","B","inconclusive"].includes(m.better))' "CIs" \
  'j.bootstrap.resamples >= 1000 && j.bootstrap.level === 0.95' "bootstrap settings" \
  'j.block_runs.map(b => b.order).join() === "AB,BA,AB,BA,AB"' "block order" \
  'new Set(j.block_runs.map(b => b.seed)).size === 5' "block seeds not distinct" \
  'j.block_runs.every(b => b.runs.A.probe.text === b.runs.B.probe.text && b.runs.A.probe.text.length > 0)' "probe texts differ on the same model" \
  'j.provenance.servers.length === 2 && j.provenance.machine.cores > 0 && /^nightshift /.test(j.provenance.bench_version) && /commit/.test(j.provenance.bench_version) && j.provenance.servers[0].models.data[0].id.length > 0 && /--scenario cold-ttft-1k/.test(j.provenance.command) && /^20\d\d-/.test(j.provenance.date)' "provenance"
grep -q 'identity gate pass' "$TMP/ab.out" || fail "summary line missing"
# single file, offline: no external reference of any kind
grep -q '<svg' "$TMP/ab.html" || fail "no SVG chart in the report"
ext=$(grep -oEi '(src|href)="[^"]*"|<script|@import|url\(' "$TMP/ab.html" | head -3)
[ -z "$ext" ] || fail "the report references something outside itself: $ext"

# other weights: the gate fails, every ratio withheld, with reasons
J=$TMP/ac.json
"$NS_BIN" bench --url "$A" --url "$C" --scenario decode-1 --max-tokens 8 --blocks 5 --seed 7 \
  --json "$J" --html "$TMP/ac.html" >"$TMP/ac.out" 2>&1 || { cat "$TMP/ac.out"; fail "bench A/C failed"; }
check "$J" \
  'j.identity.verdict === "fail"' "other weights: identity" \
  'j.identity.reasons.some(r => /greedy outputs differ/.test(r))' "reasons" \
  'j.comparison.withheld && /identity gate failed/.test(j.comparison.withheld_reason)' "comparison not withheld" \
  'j.comparison.metrics.every(m => m.withheld && m.withheld_reason && m.ratio === undefined)' "a ratio was not withheld"
grep -q 'withheld' "$TMP/ac.out" || fail "summary does not say withheld"
grep -q 'class="banner bad withheld"' "$TMP/ac.html" || fail "report hides the withheld ratios"

# a recording (of a server of its own) replays on A and B
start_server --no-ssd-cache --record "$TMP/rec"
for i in 1 2; do
  post /v1/chat/completions '{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello '$i'"}],"max_tokens":4}'
  post /v1/chat/completions '{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello '$i'"},{"role":"assistant","content":"hi"},{"role":"user","content":"more"}],"max_tokens":4}'
done
for _ in $(seq 1 100); do [ "$(wc -l <"$TMP/rec/requests.jsonl" 2>/dev/null || echo 0)" -ge 4 ] && break; sleep 0.05; done
J=$TMP/replay.json
"$NS_BIN" bench --url "$A" --url "$B" --scenario "replay:$TMP/rec/requests.jsonl" --blocks 5 --json "$J" >"$TMP/r.out" 2>&1 ||
  { cat "$TMP/r.out"; fail "bench replay failed"; }
check "$J" \
  'j.servers.every(s => s.requests === 20 && s.failed === 0) && /^2 sessions/.test(j.replay)' "replay" \
  'j.comparison.metrics.some(m => m.name === "wall_s" && !m.withheld)' "replay wall_s not compared"

# restart-resume needs a server the bench starts: skipped, with the reason
J=$TMP/rr.json
"$NS_BIN" bench --url "$A" --scenario restart-resume --blocks 1 --json "$J" >/dev/null 2>&1 || fail "restart-resume run failed"
check "$J" 'j.skipped && /starts itself/.test(j.skip_reason)' "restart-resume"

# restart-resume with a server the bench starts: after the restart the
# prompt is served (in part: the server may choose to recompute some pages)
# from the SSD tier; the server is gone when bench returns
RP=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
mkdir -p "$TMP/rr"
J=$TMP/rr/rr.json
"$NS_BIN" bench --url "http://127.0.0.1:$RP" --scenario restart-resume-1k --blocks 2 --warmup 0 --json "$J" \
  --server-cmd "'$NS_BIN' serve --host 127.0.0.1 --port $RP --threads 2 --model '$MODEL' --ssd-cache '$TMP/rr/ssd'" \
  >"$TMP/rr.out" 2>&1 || { cat "$TMP/rr.out"; fail "restart-resume with --server-cmd failed"; }
check "$J" \
  '!j.skipped && j.servers[0].failed === 0' "restart-resume failed" \
  'j.block_runs.every(b => b.runs.A.values.restart_s > 0 && b.runs.A.values.cached_frac_after > 0)' "not resumed from the cache after the restart" \
  '/--ssd-cache/.test(j.provenance.servers[0].command)' "the server command is not in the provenance"
grep -q "listening on" "$TMP/rr/bench-server-A.log" || fail "no server log next to the JSON"
# three stops (two restarts, the end), each a complete graceful shutdown:
# the bench once took its sh wrapper's exit for the server's and SIGKILLed
# the server before its SSD tier was durable (cached_frac_after 0, ~1 in 15)
n=$(grep -c "serve: stopped" "$TMP/rr/bench-server-A.log")
[ "$n" = 3 ] || fail "the bench cut a server's shutdown short: $n of 3 stops completed"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$RP/health")" = 000 ] || fail "the bench left its server running"

# usage errors and an unreachable server
"$NS_BIN" bench --url "$A" --url "$B" --scenario decode-1 --blocks 3 >/dev/null 2>"$TMP/e1"; rc=$?
[ $rc = 2 ] && grep -q 'blocks 5 or more' "$TMP/e1" || fail "--blocks 3 with two servers: rc $rc $(cat "$TMP/e1")"
"$NS_BIN" bench --url "$A" --scenario nope >/dev/null 2>"$TMP/e2"; rc=$?
[ $rc = 2 ] && grep -q 'unknown scenario' "$TMP/e2" || fail "unknown scenario: rc $rc"
"$NS_BIN" bench --url "$A" --scenario decode-1 --resamples 10 >/dev/null 2>&1; [ $? = 2 ] || fail "--resamples 10 accepted"
"$NS_BIN" bench --url http://127.0.0.1:1 --scenario decode-1 --blocks 1 >/dev/null 2>"$TMP/e3"; rc=$?
[ $rc = 1 ] && grep -q 'v1/models' "$TMP/e3" || fail "unreachable server: rc $rc $(cat "$TMP/e3")"
echo "ok - bench"
