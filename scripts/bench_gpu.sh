#!/usr/bin/env bash
# Every GPU figure, one part per call: each part fits in one 10-minute command on a lent GPU machine
# and writes its own JSON file as soon as it is done.
#
#   bash scripts/bench_gpu.sh list                       # the parts, with what each measures
#   bash scripts/bench_gpu.sh env [OUT_DIR]              # one part -> OUT_DIR/env.json (default OUT_DIR: bench_gpu)
#   bash scripts/bench_gpu.sh all [OUT_DIR]              # every part in turn (where there is no time limit)
#   DEVICE=cpu QUICK=1 bash scripts/bench_gpu.sh env out  # the same pipeline on the CPU, tiny sizes (tests)
#
# A part's file is {part, exit_code, seconds, device, gpu, torch, date, results | text, stderr_tail},
# written atomically (temp file + rename) whether the part succeeded or not, and the script exits
# with the part's own exit code (with `all`: 1 if any part failed). Parts and their sizes are chosen
# to finish in well under 10 minutes each on an H100.
set -uo pipefail

DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
PYTHON=${PYTHON:-python}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
PART=${1:-}
OUT_DIR=${2:-bench_gpu}

PARTS=(tests_cuda default_run default_run_cpu env update launches naive_fast timers_sync timers_events profile replay limits train_knobs)
PART_TIMEOUT=${PART_TIMEOUT:-0}  # seconds per part (0: none); a part cut off exits 124 and keeps its file
describe() {
    case $1 in
        env) echo "env steps/s over N (ops kernel; flood fill off and tensor): bench_env.py" ;;
        limits) echo "operators and bytes per env step vs bandwidth and launch overhead: bench_limits.py" ;;
        replay) echo "replay push/sample vs SB3 and TorchRL with storage on the GPU: bench_replay.py" ;;
        train_knobs) echo "each slow form alone against the fast config on the GPU: bench_train.py --part knobs" ;;
        timers_sync | timers_events) echo "what the ${1#timers_} timing mode costs a loop: bench_timers.py" ;;
        default_run) echo "rlperf train on the default config: wall time, phase table, time to score" ;;
        default_run_cpu) echo "the same run with --device cpu on the same machine: which device wins" ;;
        update) echo "one update, eager torch against the CUDA-graph update: bench_update.py --device cuda" ;;
        launches) echo "kernel launches per env step (ops, fused) and per update (torch, graph): bench_launches.py" ;;
        naive_fast) echo "the naive and fast configs at equal train_ratio: bench_train.py --part naive-fast" ;;
        profile) echo "rlperf profile of the default config on CUDA: the advisor's findings there" ;;
        tests_cuda) echo "the CUDA-marked tests (fails when any fails, or when none ran)" ;;
        *) return 1 ;;
    esac
}

if [[ -z "$PART" || "$PART" == -h || "$PART" == --help ]]; then
    sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
fi
if [[ "$PART" == list ]]; then
    for p in "${PARTS[@]}"; do printf '%-14s %s\n' "$p" "$(describe "$p")"; done
    exit 0
fi
if [[ "$PART" == *,* ]]; then  # several parts, in the order given
    failed=0
    for p in ${PART//,/ }; do bash "${BASH_SOURCE[0]}" "$p" "$OUT_DIR" || failed=1; done
    exit $failed
fi
if [[ "$PART" != all ]] && ! describe "$PART" >/dev/null; then
    echo "bench_gpu.sh: unknown part '$PART' (bash scripts/bench_gpu.sh list)" >&2
    exit 2
fi
if [[ "$DEVICE" == cuda* ]] && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench_gpu.sh: CUDA is not available here (set DEVICE=cpu to run the pipeline on the CPU)" >&2
    exit 2
fi
mkdir -p "$OUT_DIR" || exit 2

quick=()
[[ -n "$QUICK" ]] && quick=(--quick)
if [[ -n "$QUICK" ]]; then
    env_sizes=(--min-n 16 --max-n 64)
    limit_sizes=(--n 16,256)
    timer_sizes=(--steps 2000 --work-steps 100 --repeats 5)
    run_size=(--config smoke --steps 2000)
else
    env_sizes=(--min-n 1024 --max-n 4194304 --floods off,tensor --steps 50 --repeats 3)
    limit_sizes=(--n 256,65536,1048576,4194304)
    timer_sizes=()
    run_size=(--config default)
fi

set_command() {  # CMD=(the command of part $1)
    case $1 in
        env) CMD=("$PYTHON" "$HERE/bench_env.py" --device "$DEVICE" "${env_sizes[@]}" --no-gym --json "${quick[@]}") ;;
        limits) CMD=("$PYTHON" "$HERE/bench_limits.py" --device "$DEVICE" "${limit_sizes[@]}" --json "${quick[@]}") ;;
        replay) CMD=("$PYTHON" "$HERE/bench_replay.py" --device "$DEVICE" --json "${quick[@]}") ;;
        train_knobs) CMD=("$PYTHON" "$HERE/bench_train.py" --device "$DEVICE" --part knobs --json "${quick[@]}") ;;
        timers_sync) CMD=("$PYTHON" "$HERE/bench_timers.py" --device "$DEVICE" --mode sync "${timer_sizes[@]}") ;;
        timers_events) CMD=("$PYTHON" "$HERE/bench_timers.py" --device "$DEVICE" --mode events "${timer_sizes[@]}") ;;
        default_run) CMD=("$PYTHON" -m rlperf train "${run_size[@]}" --device "$DEVICE" --out "$SCRATCH/runs" --json) ;;
        default_run_cpu) CMD=("$PYTHON" -m rlperf train "${run_size[@]}" --device cpu --out "$SCRATCH/runs" --json) ;;
        update) CMD=("$PYTHON" "$HERE/bench_update.py" --device "$DEVICE" --part update --repeats 7 --json "${quick[@]}") ;;
        launches) CMD=("$PYTHON" "$HERE/bench_launches.py" --json) ;;
        naive_fast) CMD=("$PYTHON" "$HERE/bench_train.py" --device "$DEVICE" --part naive-fast --repeats 1 --json "${quick[@]}") ;;
        profile) CMD=("$PYTHON" -m rlperf profile "${run_size[@]}" --device "$DEVICE" --out "$SCRATCH/runs") ;;
        tests_cuda) CMD=("$PYTHON" -m pytest -q -m cuda -p no:cacheprovider -rs --timeout 240 ${PYTEST_ARGS:-}) ;;
    esac
}

run_part() {  # run one part; write OUT_DIR/PART.json; return the part's exit code
    local name=$1 started=$SECONDS rc
    SCRATCH="$(mktemp -d)"
    trap 'rm -rf "$SCRATCH"' EXIT
    echo "== $name: $(describe "$name")" >&2
    set_command "$name"
    if [[ "$PART_TIMEOUT" != 0 ]]; then CMD=(timeout "$PART_TIMEOUT" "${CMD[@]}"); fi
    (cd "$ROOT" && "${CMD[@]}") >"$SCRATCH/out" 2>"$SCRATCH/err"
    rc=$?
    if [[ "$name" == tests_cuda && $rc -eq 0 ]] && ! grep -qE '[0-9]+ passed' "$SCRATCH/out"; then
        rc=5  # every CUDA test skipped: nothing was checked on the GPU
    fi
    "$PYTHON" - "$name" "$rc" "$((SECONDS - started))" "$SCRATCH" "$OUT_DIR" "$DEVICE" <<'EOF'
import json, sys, time
from pathlib import Path

name, rc, seconds, scratch, out_dir, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]), sys.argv[6]
import torch

entry = {"part": name, "exit_code": rc, "seconds": seconds, "device": device,
         "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
         "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
text = (scratch / "out").read_text(errors="replace")
try:
    entry["results"] = json.loads(text)
except json.JSONDecodeError:  # a script that prints a table, or pytest's summary
    entry["text"] = text[-20000:]
if rc:
    entry["stderr_tail"] = (scratch / "err").read_text(errors="replace")[-3000:]
out = out_dir / f"{name}.json"
tmp = out.with_name(f".{out.name}.tmp")
tmp.write_text(json.dumps(entry, indent=2))
tmp.replace(out)
print(f"   {'ok' if rc == 0 else f'failed (exit {rc})'} in {seconds} s -> {out}", file=sys.stderr)
EOF
    rm -rf "$SCRATCH"
    return "$rc"
}

if [[ "$PART" == all ]]; then
    failed=0
    for p in "${PARTS[@]}"; do
        [[ -n "$QUICK" && "$p" == tests_cuda ]] && continue
        run_part "$p" || failed=1
    done
    exit $failed
fi
run_part "$PART"
exit $?
