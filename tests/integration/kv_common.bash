# kv_common.bash — helpers of the KV-cache integration tests
# (test_kv_tiers.sh, test_kv_fp8.sh), sourced after common.bash: a
# deterministic prompt of token ids, and a greedy completion that reports
# its output ids and what it reused from the cache, per tier.

# prompt_ids N SEED -> JSON array of N token ids (deterministic)
prompt_ids() {
  node -e 'const n=+process.argv[1];let x=+process.argv[2];const a=[];for(let i=0;i<n;i++){x=(x*1103515245+12345)%2147483648;a.push(100+(x>>8)%20000);}console.log(JSON.stringify(a))' "$1" "$2"
}

# complete IDS -> sets OUT (generated token ids, comma-joined), CACHED, TIERS
complete() {
  post /v1/completions "{\"prompt\":$1,\"max_tokens\":8,\"temperature\":0,\"return_token_ids\":true}"
  [ "$STATUS" = 200 ] || fail "completion: status $STATUS: $BODY_OUT"
  OUT=$(json_get "$BODY_OUT" 'j.choices[0].token_ids.join(",")')
  CACHED=$(json_get "$BODY_OUT" 'j.usage.prompt_tokens_details.cached_tokens')
  TIERS=$(json_get "$BODY_OUT" 'JSON.stringify(j.usage.prompt_tokens_details.cached_tokens_by_tier)')
}

# tier NAME -> the tokens the last complete() reused from tier NAME
tier() { json_get "$TIERS" "j.$1"; }
