#!/usr/bin/env bash
# Server cost of each nolock::cas script, next to plain commands and
# limits/try_increment, on a throwaway redis-server:
#
#   bash benches/cas_server_cost.sh        # PORT=16397 N=200000 by default
#
# Prints a markdown table: `usec_per_call` from INFO commandstats (server time
# per call, Lua included) and redis-benchmark throughput (50 clients,
# pipeline 16), best of 3 runs each. A program, not a test: nothing asserts.
set -euo pipefail
cd "$(dirname "$0")/.."
LUA=lua/cas
PORT=${PORT:-16397}
N=${N:-200000}
DIR=$(mktemp -d)
redis-server --port "$PORT" --save '' --appendonly no --daemonize yes \
  --dir "$DIR" --pidfile "$DIR/pid" --logfile "$DIR/log"
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT
cli() { redis-cli -p "$PORT" "$@"; }
for _ in $(seq 50); do cli PING >/dev/null 2>&1 && break; sleep 0.1; done
sha() { cli -x SCRIPT LOAD < "$LUA/$1.lua"; }
MAX=9223372036854775807; MIN=-9223372036854775808
cli SET s v >/dev/null; cli SET n 5 >/dev/null
cli HSET doc v '"x"' ver 1 >/dev/null
bench() { # name, command...: best of 3 runs (the machine is shared)
  local name=$1; shift
  local cmd; cmd=$(echo "$1" | tr 'A-Z' 'a-z')
  local best_us=999999 best_rps=0 us rps
  for _ in 1 2 3; do
    cli CONFIG RESETSTAT >/dev/null
    rps=$(redis-benchmark -p "$PORT" -n $N -c 50 -P 16 -r 1000000 -q "$@" 2>/dev/null | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | cut -d' ' -f1)
    us=$(cli INFO commandstats | tr -d '\r' | grep "^cmdstat_$cmd:" | sed 's/.*usec_per_call=\([0-9.]*\).*/\1/')
    best_us=$(awk -v a="$best_us" -v b="$us" 'BEGIN { print (b < a) ? b : a }')
    best_rps=$(awk -v a="$best_rps" -v b="$rps" 'BEGIN { printf "%d", (b > a) ? b : a }')
  done
  printf '| %-40s | %8s | %8s |\n' "$name" "$best_us" "$best_rps"
}
echo "| operation (path) | server µs/call | calls/s |"
echo "|---|---:|---:|"
bench "GET (baseline)" GET s
bench "SET (baseline)" SET s v
bench "INCRBY (baseline)" INCRBY bal 1
bench "compare_and_set (applied)" EVALSHA $(sha compare_and_set) 1 s v 0 v
bench "compare_and_set (mismatch)" EVALSHA $(sha compare_and_set) 1 s w 0 x
bench "set_if_absent (new key)" EVALSHA $(sha compare_and_set) 1 ins:__rand_int__ v 60000
bench "set_if_absent (existing)" EVALSHA $(sha compare_and_set) 1 s v 60000
bench "compare_and_expire (applied)" EVALSHA $(sha compare_and_expire) 1 s v 60000
bench "compare_and_delete (mismatch)" EVALSHA $(sha compare_and_delete) 1 s x
bench "get_versioned" EVALSHA_RO $(sha get_versioned) 1 doc
bench "set_if_version (conflict)" EVALSHA $(sha set_if_version) 1 doc 0 '"y"'
bench "set_if_version (written, new keys)" EVALSHA $(sha set_if_version) 1 doc:__rand_int__ 0 '"y"'
bench "set_if_greater (applied, new keys)" EVALSHA $(sha watermark) 1 hw:__rand_int__ 42 greater
bench "set_if_greater (kept)" EVALSHA $(sha watermark) 1 n 1 greater
bench "credit (applied)" EVALSHA $(sha adjust) 1 bal 1 $MIN $MAX
bench "debit (insufficient)" EVALSHA $(sha adjust) 1 empty -7 0 $MAX
bench "limits/try_increment (reference)" EVALSHA $(LUA=lua/limits sha try_increment) 1 lim 1000000000 60000 1
