#!/usr/bin/env bash
# Every GPU figure in one call: env, replay, limits, timers and train benchmarks on CUDA, plus the
# CUDA-marked tests, into one JSON results file.
#
#   bash scripts/bench_gpu.sh                          # writes bench_gpu_results.json (~10 min on an H100)
#   bash scripts/bench_gpu.sh results/h100.json
#   DEVICE=cpu QUICK=1 bash scripts/bench_gpu.sh out.json   # the same pipeline on the CPU, tiny sizes (tests)
#
# Each part's JSON goes to a scratch folder; the results file is written only when every part has
# finished (nothing half-written). A part that fails is recorded with its exit code and the last
# lines of its stderr, and the others still run.
set -uo pipefail

DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
OUT=${1:-bench_gpu_results.json}
PYTHON=${PYTHON:-python}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT

if [[ "$DEVICE" == cuda* ]] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench_gpu.sh: CUDA is not available here (set DEVICE=cpu to run the pipeline on the CPU)" >&2
    exit 2
fi

quick=()
[[ -n "$QUICK" ]] && quick=(--quick)

part() {  # part NAME COMMAND...: run one benchmark, its stdout (JSON) to SCRATCH/NAME.json
    local name=$1; shift
    echo "== $name: $*" >&2
    local started=$SECONDS
    "$@" >"$SCRATCH/$name.json" 2>"$SCRATCH/$name.err"
    local rc=$?
    echo "$rc $((SECONDS - started))" >"$SCRATCH/$name.rc"
    [[ $rc -eq 0 ]] || { echo "   failed (exit $rc)" >&2; tail -n 5 "$SCRATCH/$name.err" >&2; }
}

if [[ -n "$QUICK" ]]; then
    env_sizes=(--min-n 16 --max-n 64)
    limit_sizes=(--n 16,256)
else
    env_sizes=(--min-n 256 --max-n 4194304)
    limit_sizes=(--n 256,65536,1048576,4194304)
fi

part env "$PYTHON" "$HERE/bench_env.py" --device "$DEVICE" "${env_sizes[@]}" --no-gym --json "${quick[@]}"
part replay "$PYTHON" "$HERE/bench_replay.py" --device "$DEVICE" --json "${quick[@]}"
part limits "$PYTHON" "$HERE/bench_limits.py" --device "$DEVICE" "${limit_sizes[@]}" --json "${quick[@]}"
part train "$PYTHON" "$HERE/bench_train.py" --device "$DEVICE" --part knobs --json "${quick[@]}"
if [[ -n "$QUICK" ]]; then
    timer_sizes=(--steps 2000 --work-steps 100 --repeats 5)
else
    timer_sizes=()
fi
if [[ "$DEVICE" == cuda* ]]; then
    # events vs sync: what each timing mode costs a loop on this GPU (a text table, kept as text).
    part timers_sync "$PYTHON" "$HERE/bench_timers.py" --device "$DEVICE" --mode sync "${timer_sizes[@]}"
    part timers_events "$PYTHON" "$HERE/bench_timers.py" --device "$DEVICE" --mode events "${timer_sizes[@]}"
else
    part timers "$PYTHON" "$HERE/bench_timers.py" --device "$DEVICE" "${timer_sizes[@]}"
fi
if [[ -z "$QUICK" ]]; then
    # The CUDA-marked tests: their summary line goes into the results file.
    part tests_cuda bash -c "cd '$HERE/..' && '$PYTHON' -m pytest -q -m cuda -p no:cacheprovider 2>&1 | tail -n 1 | \
        '$PYTHON' -c 'import json, sys; print(json.dumps({\"summary\": sys.stdin.read().strip()}))'"
fi

"$PYTHON" - "$SCRATCH" "$OUT" "$DEVICE" <<'EOF'
import json, os, sys, time
from pathlib import Path

scratch, out, device = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
import torch

gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
results = {"device": device, "gpu": gpu, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "parts": {}}
for rc_file in sorted(scratch.glob("*.rc")):
    name = rc_file.stem
    rc, seconds = (int(x) for x in rc_file.read_text().split())
    entry = {"exit_code": rc, "seconds": seconds}
    if rc == 0:
        text = (scratch / f"{name}.json").read_text()
        try:
            entry["results"] = json.loads(text)
        except json.JSONDecodeError:  # a script that prints a table
            entry["text"] = text
    else:
        entry["stderr_tail"] = (scratch / f"{name}.err").read_text()[-2000:]
    results["parts"][name] = entry
tmp = out.with_name(out.name + ".tmp")
tmp.write_text(json.dumps(results, indent=2))
tmp.replace(out)
failed = [n for n, e in results["parts"].items() if e["exit_code"]]
print(f"wrote {out}: {len(results['parts'])} parts" + (f", failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
