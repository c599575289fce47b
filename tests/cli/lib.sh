# Shared by the CLI test scripts: sourced, not run.
#   check NAME COMMAND...   counts COMMAND's success or prints "FAIL: NAME"
#   contains FILE PATTERN   grep -q, with PATTERN taken literally as a regex
#   start_hub_replay ARGS   starts $HUB_REPLAY_BIN in the background on a free
#                           port; sets HUB_PID and URL (stopped at exit)
pass=0
fail=0
check() {
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $name" >&2; return 1; fi
}
contains() { grep -q -- "$2" "$1"; }
start_hub_replay() {
  "${HUB_REPLAY_BIN:?set HUB_REPLAY_BIN}" "$@" --port 0 >"$TMP/hub.out" 2>&1 &
  HUB_PID=$!
  trap 'kill $HUB_PID 2>/dev/null; wait $HUB_PID 2>/dev/null; rm -rf "$TMP"' EXIT
  for _ in $(seq 400); do
    grep -q "http://" "$TMP/hub.out" && break
    sleep 0.05
  done
  URL=$(grep -o 'http://[0-9.:]*' "$TMP/hub.out" | head -1)
}
