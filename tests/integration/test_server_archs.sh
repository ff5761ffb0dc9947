#!/usr/bin/env bash
# The Qwen2, Mistral and Qwen3-MoE fixtures served over HTTP (issue 14): each
# loads, names its architecture at start-up, and a greedy /v1/completions
# from a golden prompt's token ids (ignore_eos, 48 tokens) returns
# transformers' greedy continuation (token_ids), twice (the second time
# from the prefix cache). The logits themselves
# are checked in tests/golden/test_logits_golden.c; this covers the server
# path (config, scheduler, sampling, paged KV across requests) for the new
# architectures.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash

for name in tiny-qwen2 tiny-mistral tiny-qwen3moe; do
  golden=$NS_SHARED/goldens/logits-$name.json
  [ -f "$golden" ] || fail "missing $golden"
  start_server --model "$NS_SHARED/models/$name"
  case $name in
    tiny-qwen2) arch=Qwen2ForCausalLM ;;
    tiny-mistral) arch=MistralForCausalLM ;;
    tiny-qwen3moe) arch=Qwen3MoeForCausalLM ;;
  esac
  for label in story_start story_long; do
    ids=$(node -e 'const g=require(process.argv[1]);const p=g.prompts.find(p=>p.label===process.argv[2]);console.log(JSON.stringify(p.prompt_ids))' "$golden" "$label")
    want_ids=$(node -e 'const g=require(process.argv[1]);const p=g.prompts.find(p=>p.label===process.argv[2]);console.log(JSON.stringify(p.greedy_48))' "$golden" "$label")
    # twice: the second run starts from the prefix cache the first filled
    for run in 1 2; do
      post /v1/completions "{\"prompt\":$ids,\"max_tokens\":48,\"temperature\":0,\"ignore_eos\":true,\"return_token_ids\":true}"
      [ "$STATUS" = 200 ] || fail "$name/$label: completion: $STATUS $BODY_OUT"
      got=$(json_get "$BODY_OUT" 'j.choices[0].token_ids')
      [ "$got" = "$want_ids" ] || fail "$name/$label run $run: greedy ids differ from transformers':
got:  $got
want: $want_ids"
    done
  done
  grep -q "($arch, " "$LOG" || fail "$name: the start-up log does not name $arch"
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null
done
echo "ok - test_server_archs"
