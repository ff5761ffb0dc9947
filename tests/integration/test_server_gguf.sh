#!/usr/bin/env bash
# GGUF models served over HTTP (issue 14): `serve --model FILE.gguf` loads a
# GGUF file with its embedded tokenizer; /v1/completions from text returns
# llama.cpp's greedy continuation (tests/fixtures/gguf/*.llama.jsonl: text
# and token ids), twice (the second time from the prefix cache); /tokenize
# gives llama.cpp's ids (Q8_0 files of two llama models, a Q4_K qwen3); a
# truncated .gguf is refused at start-up with the parser's message and a
# non-zero exit. Logits are checked in tests/unit/model/test_gguf_logits.c.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash

G=$NS_SHARED/gguf
for name in stories260K-Q8_0 tinystories-656k-Q8_0 tiny-qwen3-k-Q4_K; do
  ref=$G/$name.llama.jsonl
  [ -f "$ref" ] || fail "missing $ref"
  start_server --model "$G/$name.gguf"
  prompt=$(head -1 "$ref" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).text)))')
  want_ids=$(head -1 "$ref" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);let n=j.greedy.length;for(let i=0;i<j.greedy.length;i++)if(j.greedy_margin[i]<=2e-3){n=i;break}console.log(JSON.stringify(j.greedy.slice(0,n)))})')
  llama_ids=$(head -1 "$ref" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(JSON.parse(s).ids)))')
  n=$(node -e 'console.log(JSON.parse(process.argv[1]).length)' "$want_ids")
  [ "$n" -gt 4 ] || fail "$name: too few clear greedy tokens in the reference ($n)"
  for run in 1 2; do
    post /v1/completions "{\"prompt\":$prompt,\"max_tokens\":$n,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}"
    [ "$STATUS" = 200 ] || fail "$name: completion: $STATUS $BODY_OUT"
    got=$(json_get "$BODY_OUT" 'j.choices[0].token_ids')
    [ "$got" = "$want_ids" ] || fail "$name run $run: greedy ids differ from llama.cpp's:
got:  $got
want: $want_ids"
  done
  post /tokenize "{\"content\":$prompt,\"add_special\":true}"
  [ "$STATUS" = 200 ] || fail "$name: tokenize: $STATUS $BODY_OUT"
  got=$(json_get "$BODY_OUT" 'j.tokens')
  [ "$got" = "$llama_ids" ] || fail "$name: /tokenize $got, llama.cpp $llama_ids"
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
done

# a corrupt GGUF: refused before serving, with the parser's message
bad=$(mktemp /tmp/ns_bad_XXXXXX.gguf)
head -c 3000 "$G/stories260K-Q8_0.gguf" >"$bad"
out=$("$NS_BIN" serve --model "$bad" --port 0 2>&1)
rc=$?
rm -f "$bad"
[ "$rc" -ne 0 ] || fail "a truncated GGUF was served"
grep -qE "truncated|runs past the end" <<<"$out" || fail "no clear message for a truncated GGUF: $out"
echo "ok - test_server_gguf"
