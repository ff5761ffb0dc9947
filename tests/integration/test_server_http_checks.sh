#!/usr/bin/env bash
# HTTP-level checks (issue 11): request heads over the limits answered in
# the JSON error shape (414, 431) instead of libmicrohttpd's HTML, the IPv6
# listen URL, and the warning for a non-loopback address without an API key.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server

# req STATUS CODE CURL_ARGS...: the status, and the error code ("-" = no error body)
req() {
  local want=$1 code=$2
  shift 2
  local st
  st=$(curl -s -o "$TMP/resp" -D "$TMP/hdr" -w '%{http_code}' "$@")
  [ "$st" = "$want" ] || fail "$*: status $st, want $want: $(head -c 300 "$TMP/resp")"
  [ "$code" = - ] && return 0
  local got
  got=$(json_get "$(cat "$TMP/resp")" '[typeof j.error.message, "type" in j.error, "param" in j.error, j.error.code].join()')
  [ "$got" = "string,true,true,$code" ] || fail "$*: error body $(head -c 300 "$TMP/resp"), want code $code"
}

# --- request heads over the limits: JSON errors, not libmicrohttpd's HTML
long=$(head -c 10000 /dev/zero | tr '\0' a)
req 414 uri_too_long "$BASE/$long"
req 414 uri_too_long "$BASE/health?q=$long"
req 431 header_too_large -H "X-Big: $long" "$BASE/health"
hdrs=()
for i in $(seq 1 10); do hdrs+=(-H "X-H$i: ${long:0:4000}"); done
req 431 header_too_large "${hdrs[@]}" "$BASE/health"
grep -qi '^content-type: application/json' "$TMP/hdr" || fail "431 without a JSON content type: $(cat "$TMP/hdr")"
health_ok

# --- the listen URL of an IPv6 address, and the warning without a key
# beyond loopback (both servers listen on a free port only briefly)
urls() {
  local log="$TMP/url.$RANDOM.log"
  NS_LOG_LEVEL=info "$NS_BIN" serve --port 0 --threads 2 --model "$MODEL" "$@" >"$log" 2>&1 &
  local pid=$!
  SERVER_PIDS+=("$pid")
  for _ in $(seq 1 500); do grep -q 'listening on' "$log" && break; sleep 0.02; done
  kill -TERM "$pid"
  wait "$pid"
  cat "$log"
}
if node -e 'const s=require("net").createServer().on("error",()=>process.exit(1)).listen(0,"::1",()=>process.exit(0))'; then
  out=$(urls --host ::1)
  grep -q 'listening on http://\[::1\]:[0-9]' <<<"$out" || fail "IPv6 listen URL: $(grep listening <<<"$out")"
  grep -q 'WARN.*without an API key' <<<"$out" && fail "a warning on loopback"
else
  echo "note: no IPv6 loopback on this machine; the [::1] listen URL is not checked"
fi
out=$(urls --host 0.0.0.0)
grep -q 'WARN.*listening on 0.0.0.0.*without an API key' <<<"$out" || fail "no warning for 0.0.0.0 without a key: $out"
out=$(urls --host 0.0.0.0 --api-key k)
grep -q 'without an API key' <<<"$out" && fail "a warning although a key is set"
echo ok
