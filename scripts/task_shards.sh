#!/bin/bash
# Runs, or resumes, the shards of one task step (ruler, niah, longeval, longbench, summarize) of an
# experiment file (configs/paper/ruler.json unless CONFIG names another; issues 23, 49): shard i of N
# goes to results/<step name>/shards/shard<i> (committed as it progresses: see .gitignore), WORKERS
# processes at one thread each take shards w, w + WORKERS, ...; when every shard is complete they
# are merged into results/<step name>/<stamp>_<sha> and converted into a results folder at
# results/<step name>/ (docs/results.md: predictions.jsonl.gz, rows.csv.gz, data.jsonl.gz, run.json).
# A killed run resumes where it stopped; to resume on another machine, commit
# `scripts/shards_pack.py pack results/<step name>` (results/<step name>/shards.tar.gz), which this
# script unpacks first.
#   scripts/task_shards.sh STEP [N_SHARDS] [WORKERS]      e.g. scripts/task_shards.sh 1 8 2
#   CONFIG=configs/qwen/niah_chelsea_4k.json scripts/task_shards.sh 1 4 1
# (scripts/ruler_shards.sh, what the RULER runs' READMEs name, is this script.)
# OPENBLAS_CORETYPE is unset, as for every shard so far: the environment's Haswell pin halves
# OpenBLAS's speed on these AVX-512 machines (README, "Speed"); kvlab itself then pins AVX-512
# kernels where OpenBLAS would fall back to SSE3 ones on a CPU it does not know (core/blas.h).
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: scripts/task_shards.sh STEP [N_SHARDS] [WORKERS]}
n=${2:-8}
workers=${3:-2}
kvlab=${KVLAB:-build/apps/kvlab}
config=${CONFIG:-configs/paper/ruler.json}
[ -x "$kvlab" ] || { echo "task_shards: $kvlab not built (scripts/setup.sh)" >&2; exit 2; }
cfg=$(mktemp --suffix=.json)
trap 'rm -f "$cfg"' EXIT
read -r command name calibrate < <(python3 - "$config" "$step" "$cfg" <<'PY'
import json, os, sys
steps = json.load(open(sys.argv[1]))["steps"]
i = int(sys.argv[2])
tasks = ("ruler", "niah", "longeval", "longbench", "summarize")  # the commands that take --shard
if not 0 <= i < len(steps) or steps[i]["command"] not in tasks:
    sys.exit(f"task_shards: step {i} of {sys.argv[1]} is not a task step ({', '.join(tasks)}; "
             f"its task steps: {[j for j, s in enumerate(steps) if s['command'] in tasks]})")
c = dict(steps[i]["config"])
name = c.pop("name")
c.pop("results_dir", None)
json.dump(c, open(sys.argv[3], "w"), indent=1)
# chelsea's outlier heads and duo_attention's head scores come from the file's calibrate steps, run
# before the shards: "-" when the step needs none, else the first missing one as "index:what:out"
methods = c.get("method", "").split(",")
calibrated = {"calibrate chelsea": "chelsea", "calibrate duo": "duo_attention"}  # step -> the method it serves
missing = [f"{j}:{s['command'].split()[1]}:{s['config']['out']}" for j, s in enumerate(steps)
           if calibrated.get(s["command"]) in methods and not os.path.exists(s["config"]["out"])]
print(steps[i]["command"], name, missing[0] if missing else "-")
PY
)
[ -n "$name" ] || exit 2
if [ "$calibrate" != "-" ]; then
  IFS=: read -r cal_step cal_what cal_out <<< "$calibrate"
  echo "task_shards: $cal_out is missing: run step $cal_step of $config (calibrate $cal_what) first, e.g." >&2
  echo "  python3 -c \"import json; json.dump(json.load(open('$config'))['steps'][$cal_step]['config'], open('/tmp/cal.json', 'w'))\" && $kvlab calibrate $cal_what --config /tmp/cal.json" >&2
  exit 2
fi
# shards in progress committed as one file (scripts/shards_pack.py): what this machine lacks of them
if [ -f "results/$name/shards.tar.gz" ]; then python3 scripts/shards_pack.py unpack "results/$name" || exit 2; fi
logs=${TMPDIR:-/tmp}
worker() {
  for ((i = $1; i < n; i += workers)); do
    # a complete shard of this very step and split is not run again (kvlab would load the model only
    # to leave it as it is). Another config or split goes to kvlab, which refuses it naming the
    # difference.
    if python3 - "results/$name/shards/shard$i" "$cfg" "$i/$n" 2>/dev/null <<'PY'
import json, sys
shard, cfg, split = sys.argv[1:]
done, want = json.load(open(f"{shard}/config.json")), json.load(open(cfg))
complete = json.load(open(f"{shard}/result.json")).get("complete")
sys.exit(not (complete and done.get("shard") == split and all(done.get(k) == v for k, v in want.items())))
PY
    then
      echo "task_shards: shard $i/$n of step $step is complete (results/$name/shards/shard$i)"
      continue
    fi
    echo "task_shards: shard $i/$n of step $step -> results/$name/shards/shard$i (progress: $logs/${command}_${name}_shard$i.log)"
    env -u OPENBLAS_CORETYPE "$kvlab" --threads 1 "$command" --config "$cfg" --shard "$i/$n" \
      --out "results/$name/shards/shard$i" > "$logs/${command}_${name}_shard$i.log" 2>&1 ||
      { echo "task_shards: shard $i failed; see $logs/${command}_${name}_shard$i.log" >&2; return 1; }
  done
}
pids=()
for ((w = 0; w < workers; ++w)); do worker "$w" & pids+=($!); done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { echo "task_shards: not merged (a shard failed)" >&2; exit 1; }
# named by the commit the binary was built from (KVLAB may be a copy made at another commit than
# the checkout's), as its result.json says
sha=$("$kvlab" --version | sed -n 's/^git \([0-9a-f]\{7\}\).*/\1/p')
merged="results/$name/$(date -u +%Y%m%d-%H%M%S)_${sha:-unknown}"
"$kvlab" merge results/"$name"/shards/shard* --out "$merged"
# the step as data (docs/results.md): what is committed; the shards and the merged run can then go
python3 scripts/results_convert.py --out "results/$name" --merged "$merged" results/"$name"/shards/shard*
