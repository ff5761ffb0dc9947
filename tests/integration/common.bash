# common.bash — sourced by tests/integration/*.sh (not a test itself).
#
# start_server [ARGS...]  starts "$NS_BIN serve" on 127.0.0.1 with a free
#                         port (--port 0; the log names it), the tiny-qwen3
#                         model unless ARGS give --model, and waits until
#                         /health is 200. Sets PORT, BASE, SERVER_PID, LOG.
# A trap kills every server started here on any exit path.
# json_get JSON EXPR      evaluates a JS expression on the parsed JSON (node).
# fail MSG                prints MSG and the server log tail, exits 1.
# expect_line TEXT KEY EXPECTED  the first line of TEXT with KEY is EXPECTED.
# Assets: $NS_SHARED (models/, goldens/), default the repository's
# tests/fixtures. curl and node are required: a missing one fails the test.
set -u
NS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NS_BIN=${NS_BIN:-build/nightshift}
NS_SHARED=${NS_SHARED:-$NS_ROOT/tests/fixtures}
MODEL=${MODEL:-$NS_SHARED/models/tiny-qwen3}
for _tool in curl node; do
  command -v "$_tool" >/dev/null || { echo "FAIL: $_tool not found: run scripts/setup"; exit 1; }
done
TMP=$(mktemp -d)
SERVER_PIDS=()
# serve's default SSD cache tier is $XDG_CACHE_HOME/nightshift: each script
# gets its own, so what another test (or the user's own server, or an
# earlier run) left there never turns a cold request into a cached one
export XDG_CACHE_HOME=$TMP/xdg-cache

cleanup() {
  for p in "${SERVER_PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
  echo "FAIL: $*"
  [ -n "${LOG:-}" ] && [ -f "$LOG" ] && { echo "--- server log (tail)"; tail -20 "$LOG"; }
  exit 1
}

# expect_line TEXT KEY EXPECTED: the first line of TEXT that contains KEY
# (a fixed string) must be EXPECTED; fails naming both otherwise.
expect_line() {
  local got
  got=$(grep -F -m1 -- "$2" <<<"$1")
  [ "$got" = "$3" ] || fail "line '$2': expected
  $3
got
  ${got:-(none)}"
}

start_server() {
  LOG="$TMP/server.$RANDOM.log"
  : >"$LOG"
  local has_model=0
  for a in "$@"; do [ "$a" = "--model" ] && has_model=1; done
  if [ $has_model -eq 1 ]; then
    NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 "$@" >"$LOG" 2>&1 &
  else
    NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 --model "$MODEL" "$@" >"$LOG" 2>&1 &
  fi
  SERVER_PID=$!
  SERVER_PIDS+=("$SERVER_PID")
  PORT=""
  for _ in $(seq 1 1500); do
    PORT=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | head -1)
    [ -n "$PORT" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited during start-up"
    sleep 0.02
  done
  [ -n "$PORT" ] || fail "server did not report its port"
  BASE="http://127.0.0.1:$PORT"
  for _ in $(seq 1 1500); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited while loading"
    sleep 0.02
  done
  fail "server not ready after 30 s"
}

json_get() {
  node -e 'let d="";process.stdin.on("data",c=>d+=c).on("end",()=>{const j=JSON.parse(d);const v=('"$2"');console.log(typeof v==="object"?JSON.stringify(v):String(v));})' <<<"$1"
}

# post PATH BODY -> sets STATUS and BODY_OUT
post() {
  BODY_OUT=$(curl -s -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$BASE$1")
  STATUS=$BODY_OUT
  BODY_OUT=$(cat "$TMP/resp")
}

# expect_error PATH BODY STATUS PARAM(or "null") [CODE]
expect_error() {
  post "$1" "$2"
  [ "$STATUS" = "$3" ] || fail "$1 $2: status $STATUS, want $3: $BODY_OUT"
  local got
  got=$(json_get "$BODY_OUT" '(typeof j.error==="object" && typeof j.error.message==="string" && j.error.message.length>0 && typeof j.error.type==="string" && ("param" in j.error) && ("code" in j.error)) + "|" + (j.error.param===null?"null":j.error.param) + "|" + j.error.code')
  local shape=${got%%|*} rest=${got#*|}
  local param=${rest%%|*} code=${rest#*|}
  [ "$shape" = true ] || fail "$1: error body has the wrong shape: $BODY_OUT"
  [ "$param" = "$4" ] || fail "$1 $2: param '$param', want '$4': $BODY_OUT"
  if [ $# -ge 5 ]; then
    [ "$code" = "$5" ] || fail "$1: code '$code', want '$5': $BODY_OUT"
  fi
}

health_ok() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")" = 200 ] || fail "/health is not 200"
}
