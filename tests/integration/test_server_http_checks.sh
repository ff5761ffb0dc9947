#!/usr/bin/env bash
# HTTP-level checks (issue 11): Content-Type on JSON POSTs (415), the Host
# header on loopback (403, DNS rebinding) and --allowed-hosts, the Origin
# header and --cors-origins (403, CORS headers, preflight), request heads
# over the limits answered in the JSON error shape (414, 431) instead of
# libmicrohttpd's HTML, the IPv6 listen URL, and the warning for a
# non-loopback address without an API key.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server
C=/v1/chat/completions
M='{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}'

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

# --- Content-Type
for t in 'text/plain' 'text/plain;charset=UTF-8' 'application/x-www-form-urlencoded' \
  'multipart/form-data; boundary=x' 'application/xml' 'application/jsonx'; do
  req 415 unsupported_media_type -H "Content-Type: $t" --data-binary "$M" "$BASE$C"
done
req 415 unsupported_media_type --data-binary '{"content":"x"}' "$BASE/tokenize" # curl -d's default type
for t in 'application/json' 'application/json; charset=utf-8' 'Application/JSON'; do
  req 200 - -H "Content-Type: $t" --data-binary "$M" "$BASE$C"
done
req 200 - -H 'Content-Type:' --data-binary "$M" "$BASE$C" # no Content-Type at all

# --- Host on a loopback address: the machine's own names, any port
req 403 host_not_allowed -H 'Host: evil.example' "$BASE/health"
[ "$(json_get "$(cat "$TMP/resp")" 'j.error.type')" = permission_error ] || fail "403 type: $(cat "$TMP/resp")"
req 403 host_not_allowed -H 'Host: evil.example:'"$PORT" -H 'Content-Type: application/json' --data-binary "$M" "$BASE$C"
req 403 host_not_allowed -H 'Host: 127.0.0.1.evil.example' "$BASE/v1/models"
for h in "127.0.0.1:$PORT" 127.0.0.1 "localhost:$PORT" LOCALHOST. '[::1]:8080' '[::1]'; do
  req 200 - -H "Host: $h" "$BASE/health"
done
req 200 - -H 'Host: localhost' -H 'Content-Type: application/json' --data-binary "$M" "$BASE$C"

# --- Origin: browsers' cross-origin requests are refused without --cors-origins
req 403 origin_not_allowed -H 'Origin: https://evil.example' "$BASE/health"
req 403 origin_not_allowed -H 'Origin: null' -H 'Content-Type: application/json' --data-binary "$M" "$BASE$C"
req 200 - -H "Origin: http://127.0.0.1:$PORT" "$BASE/health" # the server's own origin
grep -qi '^access-control-allow-origin' "$TMP/hdr" && fail "CORS header without --cors-origins"

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

# --- --allowed-hosts and --cors-origins
start_server --allowed-hosts 'ns.internal, Box.Example:8080' --cors-origins 'https://app.example'
req 200 - -H 'Host: ns.internal:9999' "$BASE/health"
req 200 - -H 'Host: box.example' "$BASE/health"
req 200 - -H "Host: 127.0.0.1:$PORT" "$BASE/health"
req 403 host_not_allowed -H 'Host: evil.example' "$BASE/health"
req 200 - -H 'Origin: https://app.example' -H 'Content-Type: application/json' --data-binary "$M" "$BASE$C"
tr -d '\r' <"$TMP/hdr" | grep -qi '^access-control-allow-origin: https://app.example$' ||
  fail "no Access-Control-Allow-Origin for an allowed origin: $(cat "$TMP/hdr")"
req 403 origin_not_allowed -H 'Origin: https://evil.example' "$BASE/health"
req 204 - -X OPTIONS -H 'Origin: https://app.example' -H 'Access-Control-Request-Method: POST' \
  -H 'Access-Control-Request-Headers: authorization, content-type' "$BASE$C"
tr -d '\r' <"$TMP/hdr" | grep -qi '^access-control-allow-methods: .*POST' || fail "preflight: $(cat "$TMP/hdr")"
tr -d '\r' <"$TMP/hdr" | grep -qi '^access-control-allow-headers: authorization, content-type' ||
  fail "preflight headers: $(cat "$TMP/hdr")"
req 403 origin_not_allowed -X OPTIONS -H 'Origin: https://evil.example' -H 'Access-Control-Request-Method: POST' "$BASE$C"

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
