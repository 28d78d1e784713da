#!/usr/bin/env bash
# `--device cuda` against `--device cpu`, on a machine with an NVIDIA GPU and PyPI's torch (CUDA) but
# no package registry (the device machine of /work/.library/device): builds kvlab against that
# LibTorch, runs `kvlab ruler` on the very same samples with --device cpu and --device cuda (one
# binary) and compares every branch's outputs, then times one 4k RULER sample (every method, the
# four ratios) on each device with a SmolLM2-135M-shaped model of random weights
# (bench/random_llama.py: the real GGUF is larger than what may travel to that machine).
#   bench/cuda_check.sh DEPS OUTDIR          DEPS made here by bench/cuda_check_deps.sh
# KVLAB=<a built kvlab> skips the dependencies and the build; DEVICES="cpu cpu" checks the script
# itself on a machine with no GPU.
# OUTDIR gets log.txt (everything printed) and parity.json. Exit 0 when both devices' outputs
# are identical on stories260K.
set -uo pipefail
deps=${1:?usage: bench/cuda_check.sh DEPS OUTDIR}
out=${2:?usage: bench/cuda_check.sh DEPS OUTDIR}
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
step() { echo; echo "== $(date -u +%T) $*"; }
secs() { date +%s.%N; }
jobs=$(nproc)
methods=exact,streaming_llm,h2o,snapkv,pyramidkv,cam,buzz,chelsea,balancekv,clustergen,knorm,tova,keydiff,lagkv,expected_attention,adakv,compactor,criticalkv,kvzip,subgen,criticaladakv

step machine
head -2 /etc/os-release; nvidia-smi -L; echo "cores: $jobs"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'

K=${KVLAB:-build-cuda/apps/kvlab}
read -r dev_a dev_b <<< "${DEVICES:-cpu cuda}"
export KVLAB_SHARED=$deps   # stories260k is $deps/models/stories260K
if [ -z "${KVLAB:-}" ]; then
step "dependencies (Debian's, unpacked: no registry here)"
for f in "$deps"/debs/*.deb; do dpkg -x "$f" / || exit 1; done
# FindHDF5 reads h5cc's link line (-lcrypto -lcurl -lsz -lz): give the runtime libraries their
# unversioned names where their -dev packages are absent
lib=/usr/lib/x86_64-linux-gnu
for l in crypto curl z; do
  [ -e "$lib/lib$l.so" ] || { v=$(ls "$lib"/lib$l.so.* 2>/dev/null | head -1); [ -n "$v" ] && ln -s "$v" "$lib/lib$l.so"; }
  ls "$lib"/lib$l.so* 2>/dev/null | head -2 || echo "no lib$l here"
done
ldconfig

step "build against this machine's LibTorch"
T=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
NV=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))')/nvidia
L=$(find "$NV" -maxdepth 3 -type d -name lib | tr '\n' ':')
if [ ! -x build-cuda/apps/kvlab ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVLAB_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$T" -DTorch_DIR="$T/share/cmake/Torch" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$L -Wl,-rpath,$L" > "$out/cmake.txt" 2>&1 ||
    { tail -40 "$out/cmake.txt"; exit 1; }
  t0=$(secs)
  cmake --build build-cuda --target kvlab -j "$jobs" > "$out/build.txt" 2>&1 || { grep -m5 -A5 error "$out/build.txt"; tail -20 "$out/build.txt"; exit 1; }
  echo "built in $(awk "BEGIN { print $(secs) - $t0 }") s"
fi
fi
ldd $K | grep "not found"
$K --version || exit 1

# the same samples on both devices: every branch's outputs compared (1 = identical outputs)
compare() {  # compare NAME CPU_DIR CUDA_DIR
  python3 - "$@" <<'PY'
import glob, json, os, sys
name, a, b = sys.argv[1:]
res = {}
for fa in sorted(glob.glob(f"{a}/pred/*/*.jsonl")):
    rel = os.path.relpath(fa, f"{a}/pred")
    fb = f"{b}/pred/{rel}"
    la = [json.loads(l) for l in open(fa)]
    lb = [json.loads(l) for l in open(fb)] if os.path.exists(fb) else []
    branch = rel.split("/")[0]
    s = res.setdefault(branch, {"n": 0, "same": 0, "first_diff": None})
    for x, y in zip(la, lb):
        s["n"] += 1
        if x["output"] == y["output"]:
            s["same"] += 1
        elif s["first_diff"] is None:
            s["first_diff"] = {"file": rel, "id": x["id"], "cpu": x["output"], "cuda": y["output"]}
    s["missing"] = len(la) - len(lb)
if not res:
    sys.exit(f"{name}: no predictions under {a}/pred")
# a branch with no outputs compared (a run that timed out, or wrote nothing) is no parity
bad = {k: v for k, v in res.items() if v["same"] != v["n"] or v["missing"] or not v["n"]}
print(f"{name}: {len(res)} branches, {sum(v['n'] for v in res.values())} outputs; "
      f"{len(res) - len(bad)} branches identical on both devices")
for k, v in bad.items():
    print(f"  {k}: {v['same']}/{v['n']} identical, {v['missing']} missing; first difference {v['first_diff']}")
json.dump(res, open(os.environ["PARITY"], "w"), indent=1)
sys.exit(1 if bad else 0)
PY
}

# the same kvlab command on both devices, timed: OUT_0 on $dev_a, OUT_1 on $dev_b (+ .txt: what it printed)
both_devices() {  # both_devices WHAT TIMEOUT OUT KVLAB_ARGS...
  local what=$1 limit=$2 dir=$3 i=0 dev t0
  shift 3
  for dev in $dev_a $dev_b; do
    t0=$(secs)
    rm -rf "${dir}_$i"
    timeout "$limit" $K --threads "$jobs" "$@" --device $dev --out "${dir}_$i" > "${dir}_$i.txt" ||
      echo "$what on $dev: exit $?"
    echo "$what on $dev ($jobs threads): $(awk "BEGIN { print $(secs) - $t0 }") s"
    i=$((i + 1))
  done
}

step "parity on stories260K (real weights): RULER at 512 tokens, every method, two ratios"
both_devices stories260K 150 /tmp/s260k ruler --model stories260k --tasks niah_single_2,fwe --lengths 512 --samples 2 \
  --method "$methods" --ratio 0.5,0.25 --preset default --protocol whole --haystack-dir "$deps/niah/PaulGrahamEssays" --quiet
PARITY="$out/parity.json" compare "stories260K, $dev_a vs $dev_b" /tmp/s260k_0 /tmp/s260k_1
parity=$?

step "a 4k RULER sample, SmolLM2-135M-shaped random weights (every branch decodes its 128 tokens)"
${PYTHON:-python3} bench/random_llama.py --config "$deps/smollm2/config.json" --tokenizer "$deps/smollm2/tokenizer.json" \
  --out /tmp/rand_smollm2 || exit 1
r4k=(ruler --model /tmp/rand_smollm2 --tasks niah_single_1 --lengths 4096 --samples 1 --preset default --protocol context
     --haystack-dir "$deps/niah/PaulGrahamEssays" --quiet)
# a step of configs/paper/ruler.json on the GPU: every method at the four ratios (85 branches)
t0=$(secs)
rm -rf /tmp/r4k_all
timeout 120 $K --threads "$jobs" "${r4k[@]}" --method "$methods" --ratio 0.75,0.5,0.25,0.125 --device $dev_b \
  --out /tmp/r4k_all > /tmp/r4k_all.txt || echo "4k, every branch, on $dev_b: exit $?"
echo "4k sample, 85 branches, on $dev_b: $(awk "BEGIN { print $(secs) - $t0 }") s"
# both devices on a smaller sample of branches: the time ratio, and the outputs
both_devices "4k sample, 4 branches," 100 /tmp/r4k "${r4k[@]}" --method streaming_llm,snapkv,kvzip --ratio 0.25
PARITY="$out/parity_4k.json" compare "random 4k, $dev_a vs $dev_b (near-uniform logits: ties)" /tmp/r4k_0 /tmp/r4k_1
echo "exit: stories260K parity $parity"
exit $parity
