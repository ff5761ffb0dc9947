#!/usr/bin/env bash
# Every malformed request gets a 4xx with the OpenAI error shape naming the
# parameter, and the server stays up (/health 200) throughout.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
start_server --max-body-bytes 1048576

C=/v1/chat/completions
M='"messages":[{"role":"user","content":"hi"}]'
expect_error $C '{"messages": [' 400 null invalid_json
expect_error $C '[1,2,3]' 400 null invalid_json
expect_error $C '' 400 null invalid_json
expect_error $C '{"model":"x"}' 400 messages missing_required_parameter
expect_error $C '{"messages":"hi"}' 400 messages invalid_type
expect_error $C '{"messages":[]}' 400 messages
expect_error $C '{"messages":[{"content":"hi"}]}' 400 'messages[0].role'
expect_error $C '{"messages":[{"role":"wizard","content":"hi"}]}' 400 'messages[0].role'
expect_error $C '{"messages":[{"role":"user","content":42}]}' 400 'messages[0].content'
expect_error $C '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}' 400 'messages[0].content[0].type'
expect_error $C "{$M,\"max_tokens\":-5}" 400 max_tokens
expect_error $C "{$M,\"max_tokens\":0}" 400 max_tokens
expect_error $C "{$M,\"max_tokens\":\"ten\"}" 400 max_tokens invalid_type
expect_error $C "{$M,\"temperature\":\"hot\"}" 400 temperature invalid_type
expect_error $C "{$M,\"temperature\":7}" 400 temperature
expect_error $C "{$M,\"top_p\":0}" 400 top_p
expect_error $C "{$M,\"n\":2}" 400 n
expect_error $C "{$M,\"stream\":\"yes\"}" 400 stream
expect_error $C "{$M,\"stop\":[1]}" 400 stop
expect_error $C "{$M,\"response_format\":{\"type\":\"yaml\"}}" 400 response_format unsupported_value
# json_object / json_schema are enforced by a grammar (tests/node/structured.test.mjs); a bad schema is a 400
expect_error $C "{$M,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}" 400 response_format.json_schema.schema
expect_error $C "{$M,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\",\"format\":\"uri\"}}}}" 400 response_format unsupported_schema
expect_error $C "{$M,\"tools\":{}}" 400 tools
expect_error $C "{$M,\"tools\":[{\"type\":\"function\",\"function\":{}}]}" 400 'tools[0].function.name'
expect_error $C "{$M,\"tool_choice\":\"sometimes\"}" 400 tool_choice
# tool_choice naming a function: it must be one of the request's tools
T='"tools":[{"type":"function","function":{"name":"get_time","parameters":{"type":"object"}}}]'
expect_error $C "{$M,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}" 400 tool_choice invalid_value
expect_error $C "{$M,$T,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}" 400 tool_choice invalid_value
expect_error $C "{$M,$T,\"tool_choice\":{\"type\":\"function\"}}" 400 tool_choice invalid_value
post $C "{$M,$T,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}},\"max_tokens\":2}"
[ "$STATUS" = 200 ] || fail "tool_choice naming a given tool: $STATUS $BODY_OUT"
# top_p: any value in (0, 1], however small
post $C "{$M,\"top_p\":1e-300,\"temperature\":1,\"max_tokens\":2}"
[ "$STATUS" = 200 ] || fail "top_p 1e-300: $STATUS $BODY_OUT"
expect_error $C "{$M,\"top_p\":-1e-300}" 400 top_p
expect_error $C "{$M,\"top_logprobs\":3}" 400 top_logprobs
expect_error $C '{"messages":[{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":5}}]}]}' 400 'messages[0].tool_calls[0].function.arguments'
# unknown fields are ignored
post $C "{$M,\"max_tokens\":2,\"frobnicate\":{\"a\":[1]},\"user\":\"u\"}"
[ "$STATUS" = 200 ] || fail "unknown fields: status $STATUS: $BODY_OUT"

# invalid JSON: the message gives the position, never the body's bytes
# (bodies hold secrets; the message is also logged)
expect_error $C '{"messages":[{"role":"user","content":"hi"}],"api_key":sk-PLANTED-SECRET}' 400 null invalid_json
case "$BODY_OUT" in *PLANTED*) fail "invalid JSON echoes the body: $BODY_OUT" ;; esac
json_get "$BODY_OUT" 'j.error.message' | grep -q 'line 1, column' || fail "invalid JSON: no position: $BODY_OUT"
grep -q PLANTED "$LOG" && fail "invalid JSON: the body reached the log"

# invalid UTF-8 (a lone continuation byte inside a string)
printf '{"messages":[{"role":"user","content":"a\x80b"}]}' >"$TMP/bad_utf8.json"
STATUS=$(curl -s -H 'Content-Type: application/json' -o "$TMP/resp" -w '%{http_code}' --data-binary @"$TMP/bad_utf8.json" "$BASE$C")
[ "$STATUS" = 400 ] || fail "invalid UTF-8: status $STATUS"
[ "$(json_get "$(cat "$TMP/resp")" 'j.error.code')" = invalid_utf8 ] || fail "invalid UTF-8: $(cat "$TMP/resp")"

# JSON nested deeper than the cap
deep=$(printf '%.0s[' $(seq 1 300))
expect_error $C "{\"messages\":$deep" 400 null json_too_deep

# oversize body: announced (Content-Length) and chunked
head -c 2000000 /dev/zero | tr '\0' 'a' >"$TMP/big.txt"
STATUS=$(curl -s -o "$TMP/resp" -w '%{http_code}' --data-binary @"$TMP/big.txt" "$BASE$C")
[ "$STATUS" = 413 ] || fail "oversize body: status $STATUS"
[ "$(json_get "$(cat "$TMP/resp")" 'j.error.code')" = body_too_large ] || fail "oversize: $(cat "$TMP/resp")"
STATUS=$(curl -s -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' -H 'Transfer-Encoding: chunked' --data-binary @"$TMP/big.txt" "$BASE$C")
[ "$STATUS" = 413 ] || fail "oversize chunked body: status $STATUS"
health_ok

# a prompt longer than the model's context (40960 tokens): token ids
ids=$(node -e 'console.log(JSON.stringify(Array.from({length:41000},(_,i)=>100+(i%1000))))')
echo "{\"prompt\":$ids,\"max_tokens\":4}" >"$TMP/long.json"
STATUS=$(curl -s -H 'Content-Type: application/json' -o "$TMP/resp" -w '%{http_code}' --data-binary @"$TMP/long.json" "$BASE/v1/completions")
[ "$STATUS" = 400 ] || fail "too-long prompt: status $STATUS: $(head -c 300 "$TMP/resp")"
R=$(cat "$TMP/resp")
[ "$(json_get "$R" 'j.error.code')" = context_length_exceeded ] || fail "too-long prompt: $R"
[ "$(json_get "$R" 'j.error.prompt_tokens')" = 41000 ] || fail "too-long prompt: token count missing: $R"
[ "$(json_get "$R" 'j.error.context_tokens')" = 40960 ] || fail "too-long prompt: context missing: $R"
[ "$(json_get "$R" 'j.error.prompt_tokens_exact')" = true ] || fail "too-long prompt: exact count: $R"
# the message names the prompt only: no "0 requested", no negative number
[ "$(json_get "$R" 'j.error.message')" = "This model's maximum context length is 40960 tokens. However, your prompt has 41000 tokens. Please shorten the prompt." ] ||
  fail "too-long prompt message: $R"

# ... and as chat text
node -e 'console.log(JSON.stringify({messages:[{role:"user",content:"hello ".repeat(42000)}],max_tokens:4}))' >"$TMP/long_chat.json"
STATUS=$(curl -s -H 'Content-Type: application/json' -o "$TMP/resp" -w '%{http_code}' --data-binary @"$TMP/long_chat.json" "$BASE$C")
R=$(cat "$TMP/resp")
[ "$STATUS" = 400 ] || fail "too-long chat prompt: status $STATUS: ${R:0:300}"
[ "$(json_get "$R" '[j.error.code,j.error.param,j.error.prompt_tokens>40960,j.error.prompt_tokens_exact].join()')" = \
  "context_length_exceeded,messages,true,false" ] || fail "too-long chat prompt: $R"
json_get "$R" 'j.error.message' | grep -q 'your prompt has more than 40960 tokens' || fail "too-long chat prompt message: $R"
# ... and as completions text
node -e 'console.log(JSON.stringify({prompt:"hello ".repeat(42000),max_tokens:4}))' >"$TMP/long_text.json"
STATUS=$(curl -s -H 'Content-Type: application/json' -o "$TMP/resp" -w '%{http_code}' --data-binary @"$TMP/long_text.json" "$BASE/v1/completions")
R=$(cat "$TMP/resp")
[ "$STATUS" = 400 ] || fail "too-long text prompt: status $STATUS: ${R:0:300}"
[ "$(json_get "$R" '[j.error.code,j.error.param,j.error.prompt_tokens>40960,j.error.prompt_tokens_exact].join()')" = \
  "context_length_exceeded,prompt,true,false" ] || fail "too-long text prompt: $R"

# completions-specific validation
expect_error /v1/completions '{"max_tokens":3}' 400 prompt missing_required_parameter
expect_error /v1/completions '{"prompt":[1,-2]}' 400 prompt
expect_error /v1/completions '{"prompt":[999999999]}' 400 prompt
expect_error /v1/completions '{"prompt":{"a":1}}' 400 prompt invalid_type
expect_error /v1/completions '{"prompt":["a","b"]}' 400 prompt
expect_error /v1/completions '{"prompt":"x","echo":true}' 400 echo
expect_error /tokenize '{"content":5}' 400 content
# /tokenize is bounded too: more than 4 contexts of text is refused
node -e 'process.stdout.write(JSON.stringify({content:"word ".repeat(170000)}))' >"$TMP/big.json"
st=$(curl -s -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/big.json" "$BASE/tokenize")
[ "$st" = 400 ] && grep -q '"code":"content_too_long"' "$TMP/resp" || fail "/tokenize of 170k words: $st $(head -c 300 "$TMP/resp")"
expect_error /detokenize '{"tokens":[1,"x"]}' 400 tokens
expect_error /detokenize '{"tokens":[-1]}' 400 tokens
# ids past the tokenizer but inside config.json's vocab_size (151669..151935 for
# tiny-qwen3): /v1/completions takes them, /detokenize gives them no text
post /v1/completions '{"prompt":[9707,151700],"max_tokens":1}'
[ "$STATUS" = 200 ] || fail "completions with a padding id: $STATUS $BODY_OUT"
post /detokenize '{"tokens":[9707,151700,151935]}'
[ "$STATUS" = 200 ] || fail "detokenize a padding id: $STATUS $BODY_OUT"
[ "$(json_get "$BODY_OUT" 'j.content')" = "$(post /detokenize '{"tokens":[9707]}'; json_get "$BODY_OUT" 'j.content')" ] ||
  fail "padding ids have text: $BODY_OUT"
expect_error /detokenize '{"tokens":[151936]}' 400 tokens
expect_error /v1/completions '{"prompt":[151936]}' 400 prompt

# routing
STATUS=$(curl -s -o "$TMP/resp" -w '%{http_code}' "$BASE/v1/nothing")
[ "$STATUS" = 404 ] || fail "unknown path: $STATUS"
[ "$(json_get "$(cat "$TMP/resp")" 'j.error.type')" = not_found_error ] || fail "404 shape: $(cat "$TMP/resp")"
STATUS=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v1/chat/completions")
[ "$STATUS" = 405 ] || fail "GET on a POST route: $STATUS"

health_ok
post $C "{$M,\"max_tokens\":3}"
[ "$STATUS" = 200 ] || fail "a good request after the bad ones: $STATUS $BODY_OUT"
kill -0 "$SERVER_PID" || fail "server died"

# A model whose output is NaN (tiny-qwen3 with model.norm.weight set to BF16
# NaN): every request gets 500 model_output_invalid, as a response and as a
# stream's error event, and the server stays up.
mkdir -p "$TMP/nan-model"
cp "$MODEL"/*.json "$TMP/nan-model/"
node -e '
const fs = require("fs");
const [src, dst] = process.argv.slice(1);
const b = fs.readFileSync(src);
const n = Number(b.readBigUInt64LE(0));
const h = JSON.parse(b.subarray(8, 8 + n).toString());
const [s, e] = h["model.norm.weight"].data_offsets;
for (let i = 8 + n + s; i < 8 + n + e; i += 2) b.writeUInt16LE(0x7fc0, i);
fs.writeFileSync(dst, b);' "$MODEL/model.safetensors" "$TMP/nan-model/model.safetensors"
start_server --model "$TMP/nan-model"
for p in "$C|{$M,\"max_tokens\":4}" "/v1/completions|{\"prompt\":\"hi\",\"max_tokens\":4,\"temperature\":0.8}"; do
  post "${p%%|*}" "${p#*|}"
  [ "$STATUS" = 500 ] || fail "NaN model ${p%%|*}: status $STATUS: $BODY_OUT"
  [ "$(json_get "$BODY_OUT" '[j.error.code,j.error.type,j.error.message].join()')" = \
    "model_output_invalid,server_error,the model produced non-finite logits" ] || fail "NaN model: $BODY_OUT"
done
S=$(curl -sN -H 'Content-Type: application/json' -d "{$M,\"max_tokens\":4,\"stream\":true}" "$BASE$C")
echo "$S" | grep -q '^data: {"error":{.*"code":"model_output_invalid"' || fail "NaN model stream: $S"
echo "$S" | grep -q '^data: \[DONE\]' || fail "NaN model stream has no [DONE]: $S"
health_ok
[ "$(grep -c 'fails with model_output_invalid' "$LOG")" = 1 ] || fail "the non-finite warning is not logged exactly once"
echo "ok"
