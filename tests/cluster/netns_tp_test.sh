#!/usr/bin/env bash
# Multi-host tensor parallelism on one machine (docs/tp.md "Multi-host"): three network namespaces
# stand for three hosts on a private subnet, joined by veth pairs to a bridge in a fourth
# ("switch") namespace; the root namespace is not touched.
#
#   host S  10.77.0.1  scheduler (--listen 10.77.0.1, TLS + bearer tokens) and gateway
#   host A  10.77.0.2  worker --tp-rank 0 (Gloo address: the route to the scheduler, by default)
#   host B  10.77.0.3  worker --tp-rank 1 (Gloo address: --tp-iface eth0)
#
# Each host namespace has only `lo` and its `eth0`, so every byte between the ranks and the
# scheduler crosses the veth links: a loopback address anywhere in the bootstrap would fail.
# Checks: a non-loopback --listen without tokens is refused; a worker without the token is refused
# UNAUTHENTICATED; the TP = 2 group forms across hosts and concurrent greedy generations through
# the gateway equal single-process `deltaserve generate`; SIGKILL of rank 1 fails the in-flight
# request UNAVAILABLE, health goes NOT_SERVING and rank 0 exits; a restarted group serves again;
# taking host B's link down mid-stream (no RST, the realistic lost host) fails the request within
# the scheduler's step timeout.
#
# usage: netns_tp_test.sh DELTASERVE DELTACTL   (DS_NETNS_KEEP=1 keeps the logs)
# Exit 0 = pass, 1 = fail, 77 = skipped (not root, or no netns / veth / bridge support).
set -u
DS=${1:?usage: netns_tp_test.sh DELTASERVE DELTACTL}
CTL=${2:?usage: netns_tp_test.sh DELTASERVE DELTACTL}

skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (uid $(id -u))"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v python3 >/dev/null || skip "no python3 (compares the JSON reference)"
[ -x "$DS" ] && [ -x "$CTL" ] || { echo "FAIL: $DS or $CTL is not executable"; exit 1; }

# Unique per run: parallel ctest runs must not collide. Interface names live inside the
# namespaces, so they can be fixed.
ID=dsnet$$
NS_X=${ID}x NS_S=${ID}s NS_A=${ID}a NS_B=${ID}b
WORK=$(mktemp -d "/tmp/ds_netns_$$.XXXX")
PIDS=()
T0=$(date +%s.%N)

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  # Deleting a namespace deletes its veth ends, whose peers go with them.
  for ns in "$NS_S" "$NS_A" "$NS_B" "$NS_X"; do ip netns del "$ns" 2>/dev/null; done
  if [ -n "${DS_NETNS_KEEP:-}" ]; then echo "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

elapsed() { python3 -c "import time; print(f'{time.time() - $T0:.1f}')"; }
say() { echo "[$(elapsed) s] $*"; }
fail() {
  echo "FAIL: $*"
  for f in "$WORK"/*.log; do
    [ -f "$f" ] && { echo "----- $(basename "$f") -----"; tail -n 40 "$f"; }
  done
  exit 1
}

# ---- the network ---------------------------------------------------------------------------
net() { "$@" 2>"$WORK/ip.err" || skip "'$*' failed: $(cat "$WORK/ip.err")"; }
for ns in "$NS_X" "$NS_S" "$NS_A" "$NS_B"; do net ip netns add "$ns"; done
net ip -n "$NS_X" link add br0 type bridge
net ip -n "$NS_X" link set br0 up
i=1
for h in s a b; do
  ns=${ID}$h
  # Both ends created inside their namespaces: nothing ever appears in the root namespace.
  net ip link add eth0 netns "$ns" type veth peer name "p$h" netns "$NS_X"
  net ip -n "$NS_X" link set "p$h" master br0
  net ip -n "$NS_X" link set "p$h" up
  net ip -n "$ns" addr add "10.77.0.$i/24" dev eth0
  net ip -n "$ns" link set eth0 up
  net ip -n "$ns" link set lo up
  i=$((i + 1))
done
S_IP=10.77.0.1
STEP_TIMEOUT=4
say "namespaces $NS_S (scheduler, gateway) $NS_A (rank 0) $NS_B (rank 1), bridge in $NS_X"

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
# start NS NAME ARGS...: a background process in NS, logging to $WORK/NAME.log; sets $LAST.
start() {
  local ns=$1 name=$2; shift 2
  ip netns exec "$ns" "$@" >"$WORK/$name.log" 2>&1 &
  LAST=$!
  PIDS+=("$LAST")
}
wait_file() {  # wait_file FILE PID SECONDS
  for _ in $(seq $(($3 * 10))); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# ---- model, reference, credentials ---------------------------------------------------------
MODEL=$WORK/tiny.gguf
"$DS" gguf-synth --out "$MODEL" >"$WORK/synth.log" 2>&1 || fail "synth"
PROMPTS=("72,101,108,108,111,44,32,100,101,108,116,97" "87,111,114,108,100" "1,2,3,4,5,6,7,8,9")
MAX=(24 16 20)
for k in 0 1 2; do
  "$DS" generate --model "$MODEL" --prompt-ids "${PROMPTS[$k]}" --max-tokens "${MAX[$k]}" \
    --backend cpu --threads 1 --json --ignore-eos 2>"$WORK/ref$k.log" |
    python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["tokens"])))' \
      >"$WORK/want$k" || fail "reference generate for prompt $k"
done

umask 077
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$WORK/internal.keys"
TLS=()
CA=()
if command -v openssl >/dev/null &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=deltaserve-scheduler -addext "subjectAltName=IP:$S_IP" \
    -keyout "$WORK/sched.key" -out "$WORK/sched.crt" >"$WORK/openssl.log" 2>&1; then
  TLS=(--tls-cert "$WORK/sched.crt" --tls-key "$WORK/sched.key")
  CA=(--scheduler-ca "$WORK/sched.crt")
  say "internal listener: TLS (self-signed for IP $S_IP) + bearer token"
else
  say "internal listener: bearer token only (no openssl to make a certificate)"
fi
KEY=(--scheduler-key-file "$WORK/internal.keys")

# ---- scheduler -----------------------------------------------------------------------------
# Beyond loopback without tokens: refused at start.
in_ns "$NS_S" "$DS" scheduler --listen "$S_IP:0" >"$WORK/refused.log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "internal-key-file" "$WORK/refused.log" ||
  fail "scheduler --listen $S_IP:0 without --internal-key-file: rc $rc, want 2 and a hint"
say "a non-loopback --listen without tokens is refused (exit 2)"

start "$NS_S" scheduler "$DS" scheduler --listen "$S_IP:0" --port-file "$WORK/sched.port" \
  --internal-key-file "$WORK/internal.keys" "${TLS[@]}" --slots 4 --ctx 4096 --log-interval 0 \
  --step-timeout "$STEP_TIMEOUT"
SCHED_PID=$LAST
wait_file "$WORK/sched.port" "$SCHED_PID" 20 || fail "scheduler did not start"
SCHED="$S_IP:$(cut -d' ' -f1 "$WORK/sched.port")"

# A worker without the token: refused.
in_ns "$NS_B" timeout 60 "$DS" worker --scheduler "$SCHED" "${CA[@]}" --model "$MODEL" \
  --backend cpu --threads 1 --worker-id intruder --connect-timeout 10 >"$WORK/intruder.log" 2>&1
rc=$?
[ $rc = 1 ] && grep -qi "bearer\|authorization\|unauthenticated" "$WORK/intruder.log" ||
  fail "a worker without the token: rc $rc, want 1 and UNAUTHENTICATED"
say "a worker without the token is refused (UNAUTHENTICATED)"

# ---- the TP group across hosts + gateway ---------------------------------------------------
RANK=(--model "$MODEL" --backend cpu --threads 1 --tp-world 2 --tp-group g --split 1,1)
start "$NS_A" rank0 "$DS" worker --scheduler "$SCHED" "${KEY[@]}" "${CA[@]}" "${RANK[@]}" \
  --tp-rank 0 --worker-id hostA-rank0
R0=$LAST
start "$NS_B" rank1 "$DS" worker --scheduler "$SCHED" "${KEY[@]}" "${CA[@]}" "${RANK[@]}" \
  --tp-rank 1 --worker-id hostB-rank1 --tp-iface eth0
R1=$LAST
start "$NS_S" gateway "$DS" gateway --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
  --scheduler "$SCHED" "${KEY[@]}" "${CA[@]}" --model "$MODEL" --port-file "$WORK/gw.port" \
  --health-interval-ms 100
GW_PID=$LAST
wait_file "$WORK/gw.port" "$GW_PID" 20 || fail "gateway did not start"
read -r GP AP _ <"$WORK/gw.port"
GW=127.0.0.1:$GP ADMIN=127.0.0.1:$AP
health() { in_ns "$NS_S" "$CTL" health --addr "$GW" 2>/dev/null; }

for _ in $(seq 600); do
  [ "$(health)" = SERVING ] && break
  kill -0 "$R0" 2>/dev/null && kill -0 "$R1" 2>/dev/null || fail "a rank exited before serving"
  sleep 0.1
done
[ "$(health)" = SERVING ] || fail "the cluster did not reach SERVING within 60 s"
say "TP = 2 group across $NS_A and $NS_B serving"
in_ns "$NS_S" "$CTL" status --admin-addr "$ADMIN" >"$WORK/status.txt" 2>&1
grep -q "tp=2" "$WORK/status.txt" || fail "status shows no tp=2 worker: $(cat "$WORK/status.txt")"
grep -q 'event=tp_joined.* addr=10\.77\.0\.2' "$WORK/rank0.log" ||
  fail "rank 0 did not join on 10.77.0.2 (the route to the scheduler)"
grep -q 'event=tp_joined.* addr="iface eth0"' "$WORK/rank1.log" || fail "rank 1 did not join on eth0"
# The Gloo mesh is a TCP connection between the two hosts' addresses.
in_ns "$NS_A" ss -tn state established | grep -q "10.77.0.2:[0-9]* *10.77.0.3:" ||
  in_ns "$NS_A" ss -tn state established | grep -q "10.77.0.3:[0-9]* *10.77.0.2:" ||
  fail "no TCP connection between 10.77.0.2 and 10.77.0.3: $(in_ns "$NS_A" ss -tn)"

# ---- greedy generations, concurrent, through the gateway ----------------------------------
gen_pids=()
for k in 0 1 2; do
  in_ns "$NS_S" "$CTL" generate --addr "$GW" --prompt-ids "${PROMPTS[$k]}" \
    --max-tokens "${MAX[$k]}" --ignore-eos --ids-only --timeout 60 \
    >"$WORK/got$k" 2>"$WORK/gen$k.log" &
  gen_pids+=($!)
done
for k in 0 1 2; do
  wait "${gen_pids[$k]}" || fail "generate $k: $(cat "$WORK/gen$k.log")"
  [ "$(cat "$WORK/got$k")" = "$(cat "$WORK/want$k")" ] ||
    fail "prompt $k: cluster gave $(cat "$WORK/got$k"), single process $(cat "$WORK/want$k")"
done
say "3 concurrent greedy generations equal single-process deltaserve generate"

# A request long enough to be streaming when the group breaks: in_flight NAME starts it ($INFLIGHT).
in_flight() {
  in_ns "$NS_S" "$CTL" generate --addr "$GW" --prompt-ids "${PROMPTS[0]}" --max-tokens 3000 \
    --ignore-eos --ids-only --timeout 60 >"$WORK/$1.out" 2>"$WORK/$1.log" &
  INFLIGHT=$!
  sleep 1
  kill -0 "$INFLIGHT" 2>/dev/null || fail "the long request ended early: $(cat "$WORK/$1.log")"
}
# fails_unavailable NAME WHAT: it must end with gRPC UNAVAILABLE, and health go NOT_SERVING;
# sets T_FAILED.
fails_unavailable() {
  local r
  wait "$INFLIGHT"
  r=$?
  T_FAILED=$(date +%s.%N)
  [ $r != 0 ] && grep -q "UNAVAILABLE: " "$WORK/$1.log" ||
    fail "in-flight request after $2: rc $r, want UNAVAILABLE: $(cat "$WORK/$1.log")"
  for _ in $(seq 50); do
    [ "$(health)" = NOT_SERVING ] && break
    sleep 0.1
  done
  [ "$(health)" = NOT_SERVING ] || fail "health is $(health) after $2, want NOT_SERVING"
}

# ---- rank 1's host loses its worker --------------------------------------------------------
in_flight long
T_KILL=$(date +%s.%N)
{ kill -KILL "$R1" && wait "$R1"; } 2>/dev/null
fails_unavailable long "killing rank 1"
say "in-flight request failed UNAVAILABLE $(python3 -c "print(f'{($T_FAILED - $T_KILL) * 1e3:.0f}')") ms after rank 1 was killed"
for _ in $(seq 150); do
  kill -0 "$R0" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$R0" 2>/dev/null && fail "rank 0 outlived its group by 15 s"
say "health NOT_SERVING, rank 0 exited"

# ---- rank 1's host drops off the network -------------------------------------------------
# No RST reaches anyone: rank 0 waits inside the all-reduce and only the scheduler's step timeout
# (--step-timeout $STEP_TIMEOUT) notices. A new group (new rendezvous generation) first.
start "$NS_A" rank0b "$DS" worker --scheduler "$SCHED" "${KEY[@]}" "${CA[@]}" "${RANK[@]}" \
  --tp-rank 0 --worker-id hostA-rank0
R0=$LAST
start "$NS_B" rank1b "$DS" worker --scheduler "$SCHED" "${KEY[@]}" "${CA[@]}" "${RANK[@]}" \
  --tp-rank 1 --worker-id hostB-rank1 --tp-iface eth0
R1=$LAST
for _ in $(seq 600); do
  [ "$(health)" = SERVING ] && break
  sleep 0.1
done
[ "$(health)" = SERVING ] || fail "the restarted group did not reach SERVING within 60 s"
in_ns "$NS_S" "$CTL" generate --addr "$GW" --prompt-ids "${PROMPTS[1]}" \
  --max-tokens "${MAX[1]}" --ignore-eos --ids-only --timeout 60 >"$WORK/again.out" \
  2>"$WORK/again.log" || fail "generate on the restarted group: $(cat "$WORK/again.log")"
[ "$(cat "$WORK/again.out")" = "$(cat "$WORK/want1")" ] || fail "restarted group: wrong tokens"
say "a restarted group serves again (same greedy output)"
in_flight cut
T_CUT=$(date +%s.%N)
ip -n "$NS_B" link set eth0 down
fails_unavailable cut "cutting host B off"
CUT_S=$(python3 -c "print(f'{$T_FAILED - $T_CUT:.1f}')")
python3 -c "import sys; sys.exit(0 if $CUT_S < $STEP_TIMEOUT + 5 else 1)" ||
  fail "the request failed only after $CUT_S s (step timeout $STEP_TIMEOUT s)"
say "host B cut off (link down): request UNAVAILABLE after $CUT_S s (step timeout $STEP_TIMEOUT s), NOT_SERVING"
say "PASS"
exit 0
