#!/usr/bin/env bash
# Signals (issue 11, item 5): SIGTERM must always drain a serving server,
# wherever it lands.
#
# 1. Every thread of `serve` but the one waiting in sigtimedwait has SIGINT
#    and SIGTERM blocked -- OpenBLAS's workers too, which start in a library
#    constructor before main (src/main.c blocks the signals from the
#    executable's preinit array for that reason).
# 2. SIGTERM 20 times at random moments while two streams run (tinystories,
#    400-token streams): every run exits 0 and both clients get the final
#    event (finish_reason "length", then data: [DONE]).
# 3. The other subcommands still die of SIGTERM/SIGINT (exit 143/130).
# 4. SIGTERM while the model load is stuck (the SSD tier's index.db locked
#    by another process: SQLite's busy timeout holds the loader ~5 s) stops
#    the server within about --shutdown-timeout instead of waiting for the
#    load (cli_serve leaves a stuck loader behind). STUCK_LOAD_STRICT=0
#    only checks that the server stops with 0.
cd "$(dirname "$0")/../.." && source tests/integration/common.bash
MODEL=$NS_SHARED/models/tinystories-656k
STUCK_LOAD_STRICT=${STUCK_LOAD_STRICT:-1}

# status_sigblk PID -> "tid mask" lines for every thread
sigblk() {
  local t
  for t in /proc/"$1"/task/*; do
    echo "$(basename "$t") $(sed -n 's/^SigBlk:[[:space:]]*//p' "$t/status" 2>/dev/null)"
  done
}

# ---- 1. masks
start_server --no-ssd-cache
n=0
while read -r tid mask; do
  [ -n "$mask" ] || continue
  [ "$tid" = "$SERVER_PID" ] && continue # the sigtimedwait thread: unblocked while it waits
  n=$((n + 1))
  (( (0x$mask & 0x4002) == 0x4002 )) || fail "thread $tid has SIGINT/SIGTERM unblocked (SigBlk $mask)"
done < <(sigblk "$SERVER_PID")
[ $n -ge 2 ] || fail "expected OpenBLAS/HTTP/engine threads, saw $n"
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"; rc=$?
[ $rc -eq 0 ] || fail "exit $rc after SIGTERM (masks)"

# ---- 2. SIGTERM at random moments during streaming
BODY='{"prompt":"Once upon a time","max_tokens":400,"ignore_eos":true,"stream":true}'
for run in $(seq 1 20); do
  start_server --no-ssd-cache --shutdown-timeout 30
  for c in 1 2; do
    curl -sN -H 'Content-Type: application/json' -d "$BODY" "$BASE/v1/completions" >"$TMP/s$c" &
    eval "CURL$c=\$!"
  done
  # both streams have begun (a first chunk arrived) ...
  for _ in $(seq 1 500); do
    [ -s "$TMP/s1" ] && [ -s "$TMP/s2" ] && break
    sleep 0.01
  done
  [ -s "$TMP/s1" ] && [ -s "$TMP/s2" ] || fail "run $run: the streams did not start"
  # ... then a random moment within them (a 400-token stream takes ~0.2-1 s here)
  sleep "0.$(printf '%03d' $((RANDOM % 200)))"
  kill -TERM "$SERVER_PID"
  wait "$CURL1"; wait "$CURL2"
  wait "$SERVER_PID"; rc=$?
  [ $rc -eq 0 ] || fail "run $run: exit status $rc after SIGTERM (no drain)"
  for c in 1 2; do
    tail -c 400 "$TMP/s$c" | grep -q '"finish_reason":"length"' ||
      fail "run $run: stream $c has no final chunk: $(tail -c 300 "$TMP/s$c")"
    [ "$(tail -n 2 "$TMP/s$c" | head -1)" = "data: [DONE]" ] ||
      fail "run $run: stream $c does not end with [DONE]: $(tail -c 300 "$TMP/s$c")"
  done
  grep -q 'SIGTERM received' "$LOG" || fail "run $run: no shutdown log line"
  rm -f "$TMP/s1" "$TMP/s2"
done

# ---- 3. other subcommands die of the signal (default action)
# tokenize blocks reading a FIFO this shell keeps open; a background job of
# a script starts with SIGINT ignored: env resets it
mkfifo "$TMP/in"
exec 7<>"$TMP/in"
for sig in TERM INT; do
  env --default-signal=INT "$NS_BIN" tokenize --model "$MODEL" <"$TMP/in" >/dev/null 2>&1 &
  P=$!
  sleep 0.3
  kill -0 "$P" 2>/dev/null || fail "tokenize exited early"
  kill -"$sig" "$P"
  wait "$P"; rc=$?
  want=$((128 + $(kill -l "$sig")))
  [ $rc -eq $want ] || fail "tokenize: exit $rc after SIG$sig, want $want"
done
exec 7>&-

# ---- 4. SIGTERM during a stuck load
mkdir -p "$TMP/ssd"
# a write lock over all of index.db: SQLite in the loader retries for its busy timeout (5 s)
perl -e 'use Fcntl; open(my $f, ">>", $ARGV[0]) or die "$!"; fcntl($f, F_SETLKW, pack("s s x4 q q l x4", F_WRLCK, SEEK_SET, 0, 0, 0)) or die "lock: $!"; $| = 1; print "locked\n"; sleep 60' \
  "$TMP/ssd/index.db" >"$TMP/lock.out" &
LOCKER=$!
SERVER_PIDS+=("$LOCKER")
for _ in $(seq 1 200); do grep -q locked "$TMP/lock.out" && break; sleep 0.01; done
grep -q locked "$TMP/lock.out" || fail "could not lock index.db"
LOG="$TMP/load.log"
NS_LOG_LEVEL=info "$NS_BIN" serve --host 127.0.0.1 --port 0 --threads 2 --model "$MODEL" --ssd-cache "$TMP/ssd" \
  --shutdown-timeout 1 >"$LOG" 2>&1 &
SERVER_PID=$!
SERVER_PIDS+=("$SERVER_PID")
for _ in $(seq 1 500); do grep -q 'listening on' "$LOG" && break; sleep 0.01; done
grep -q 'listening on' "$LOG" || fail "the server did not start listening"
sleep 0.3
grep -q 'model ready' "$LOG" && fail "the load was not held up by the locked index"
start=$(date +%s%N)
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"; rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ $rc -eq 0 ] || fail "exit $rc after SIGTERM during the load"
echo "SIGTERM during a stuck load: stopped after $ms ms"
if [ "$STUCK_LOAD_STRICT" = 1 ]; then
  [ $ms -lt 3500 ] || fail "SIGTERM during a stuck load took $ms ms (the loader was waited for)"
elif [ $ms -ge 3500 ]; then
  echo "note: the server waited for the stuck loader ($ms ms): cli_serve does not abandon it yet (STUCK_LOAD_STRICT=0)"
fi
kill "$LOCKER" 2>/dev/null
echo ok
