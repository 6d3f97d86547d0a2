#!/usr/bin/env bash
# LiteLLM's added time to first token beside tailcut's and the bare proxy's, in one run of
# `tailcut-bench overhead` against the same simulated upstream (not run in CI).
#
# Makes a venv with `litellm[proxy]` from PyPI (LITELLM_VERSION pins it), starts the LiteLLM
# proxy on loopback with a fresh master key and the local model cost map, pointed at the
# bench's upstream on a fixed port, waits until it answers, and runs the bench with the proxy
# as a fourth way. Everything it makes is under $WORK; the proxy is stopped on exit.
#
#   benches/peers/litellm.sh                 # 1,000 rounds after 100 warm-up rounds
#   REQUESTS=2000 WARMUP=200 benches/peers/litellm.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/tailcut-litellm}
VENV=$WORK/venv
UPSTREAM_PORT=${UPSTREAM_PORT:-18931}
PEER_PORT=${PEER_PORT:-18932}
REQUESTS=${REQUESTS:-1000}
WARMUP=${WARMUP:-100}
BENCH=${BENCH:-$ROOT/target/release/tailcut-bench}

mkdir -p "$WORK"
if [ ! -x "$VENV/bin/litellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "litellm[proxy]${LITELLM_VERSION:+==$LITELLM_VERSION}"
fi
if [ ! -x "$BENCH" ]; then
  cargo build --release -p tailcut-bench --manifest-path "$ROOT/Cargo.toml"
fi

KEY="sk-bench-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
cat > "$WORK/litellm.yaml" <<YAML
model_list:
  - model_name: flat
    litellm_params:
      model: openai/flat
      api_base: http://127.0.0.1:${UPSTREAM_PORT}/s/flat/v1
      api_key: unused
general_settings:
  master_key: ${KEY}
litellm_settings:
  telemetry: false
YAML

export LITELLM_LOCAL_MODEL_COST_MAP=True
export LITELLM_LOG=ERROR
"$VENV/bin/litellm" --config "$WORK/litellm.yaml" --host 127.0.0.1 --port "$PEER_PORT" --num_workers 1 \
  > "$WORK/litellm.log" 2>&1 &
PEER_PID=$!
trap 'kill "$PEER_PID" 2>/dev/null || true; wait "$PEER_PID" 2>/dev/null || true' EXIT

for _ in $(seq 1 180); do
  if curl -sf -o /dev/null "http://127.0.0.1:${PEER_PORT}/health/liveliness"; then
    break
  fi
  if ! kill -0 "$PEER_PID" 2>/dev/null; then
    echo "litellm exited; its log is $WORK/litellm.log" >&2
    exit 1
  fi
  sleep 1
done

"$VENV/bin/litellm" --version 2>/dev/null | tail -1 || true
echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
TAILCUT_BENCH_PEER_KEY="$KEY" "$BENCH" overhead --requests "$REQUESTS" --warmup "$WARMUP" \
  --upstream-listen "127.0.0.1:${UPSTREAM_PORT}" --peer "litellm=http://127.0.0.1:${PEER_PORT}" \
  --out "$WORK/out"
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
