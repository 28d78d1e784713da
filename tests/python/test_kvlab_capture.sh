#!/usr/bin/env bash
# python/kvlab_capture.py against 'kvlab dump' on SmolLM2-135M (the repository's Q4_1 GGUF):
#   (a) kvlab dump of a fixed prompt (--chat-template none: its token ids are fixed) and its ids;
#   (b) kvlab_capture.py on the same ids (--prompt-ids), layers and queries; it refuses an existing
#       --out without --overwrite;
#   (c) kvlab inspect accepts the Python capture (exit 0);
#   (d) q/k/v of the two captures agree (max abs and relative L2 printed per layer and tensor);
#   (e) kvlab replay (snapkv, streaming_llm) gives the same rows on both;
#   (f) --dtype bfloat16: the 16-bit HDF5 float type kvlab writes (inspect accepts it, same file type
#       as kvlab dump --dtype bfloat16, values exactly the bfloat16 rounding of the float32 capture).
#
#   tests/python/test_kvlab_capture.sh KVLAB_BIN REPO_ROOT
#   Python: ${KVLAB_PY:-/opt/kvlab-py/bin/python}, with torch, transformers, accelerate (transformers
#   needs it to load a GGUF), gguf and h5py. Exit 0 pass, 1 fail, 77 skipped (one line saying why).
#   40-60 s on a busy 2-core machine (most of it transformers dequantizing the GGUF, twice).
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 KVLAB_BIN REPO_ROOT" >&2
  exit 2
fi
KVLAB="$1"
ROOT="$2"
PY="${KVLAB_PY:-/opt/kvlab-py/bin/python}"
SCRIPT="$ROOT/python/kvlab_capture.py"

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

command -v "$PY" >/dev/null 2>&1 || skip "no Python at $PY (set KVLAB_PY)"
missing=$("$PY" - <<'EOF' 2>/dev/null
import importlib.util
print(" ".join(m for m in ("torch", "transformers", "accelerate", "gguf", "h5py", "numpy")
               if importlib.util.find_spec(m) is None))
EOF
) || skip "$PY does not run"
[ -z "$missing" ] || skip "$PY lacks $missing (pip install $missing)"
GGUF=""
for f in "$ROOT"/models/smollm2-135m/*.gguf; do
  if [ -f "$f" ]; then GGUF="$f"; break; fi
done
[ -n "$GGUF" ] || skip "no SmolLM2 GGUF under $ROOT/models/smollm2-135m (data_scripts/get_smollm2.sh)"
[ -x "$KVLAB" ] || fail "kvlab binary '$KVLAB' not found"
[ -f "$SCRIPT" ] || fail "$SCRIPT not found"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvlab_capture_test.XXXXXX") || fail "mktemp"
trap 'rm -rf "$TMP"' EXIT
START=$(date +%s)

# Layers 0 and 29 (first and last of 30), two between; the last 16 queries only (q_start > 0).
LAYERS=0,1,15,29
QUERIES=last:16
PROMPT="The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks \
were striking thirteen. Winston Smith, his chin nuzzled into his breast in an effort to escape the vile \
wind, slipped quickly through the glass doors of Victory Mansions, though not quickly enough."

# (a) kvlab dump, float32 and bfloat16
for dt in float32 bfloat16; do
  "$KVLAB" --threads 1 dump --model "$GGUF" --prompt "$PROMPT" --chat-template none --layers "$LAYERS" \
    --queries "$QUERIES" --dtype "$dt" --out "$TMP/kvlab_$dt.h5" >"$TMP/dump_$dt.log" 2>&1 ||
    { cat "$TMP/dump_$dt.log"; fail "kvlab dump --dtype $dt"; }
done
IDS=$("$PY" -c "import h5py, sys; print(','.join(map(str, h5py.File(sys.argv[1], 'r')['sample_0000/tokens'][:])))" \
  "$TMP/kvlab_float32.h5") || fail "cannot read the dump's token ids"
N_TOKENS=$(echo "$IDS" | tr ',' '\n' | wc -l)
echo "prompt: $N_TOKENS tokens, layers $LAYERS, queries $QUERIES"

# (b) kvlab_capture.py on the same ids
capture() {  # capture OUT DTYPE LAYERS [extra args]
  local out="$1" dt="$2" layers="$3"
  shift 3
  "$PY" "$SCRIPT" --model "$GGUF" --prompt-ids "$IDS" --layers "$layers" --queries "$QUERIES" --dtype "$dt" \
    --threads 1 --out "$out" "$@" >"$out.log" 2>&1
}
capture "$TMP/py_float32.h5" float32 "$LAYERS" || { cat "$TMP/py_float32.h5.log"; fail "kvlab_capture.py"; }
grep "wrote\|warning" "$TMP/py_float32.h5.log"
before=$(cksum <"$TMP/py_float32.h5")
if capture "$TMP/py_float32.h5" float32 "$LAYERS"; then fail "kvlab_capture.py overwrote --out without --overwrite"; fi
grep -q "exists; pass --overwrite" "$TMP/py_float32.h5.log" || { cat "$TMP/py_float32.h5.log"; fail "no refusal message"; }
[ "$(cksum <"$TMP/py_float32.h5")" = "$before" ] || fail "the refused run changed --out"
[ ! -e "$TMP/py_float32.h5.partial" ] || fail "a .partial file was left behind"
echo "ok: an existing --out is refused without --overwrite"
# a file of the model directory it reads is never written, even with --overwrite (issue 50: --out
# <model dir>/model.safetensors --overwrite replaced the weights)
mkdir "$TMP/modeldir" && cp "$GGUF" "$TMP/modeldir/m.gguf" && echo '{"weights": "stand-in"}' >"$TMP/modeldir/model.safetensors"
before=$(cksum <"$TMP/modeldir/model.safetensors")
if "$PY" "$SCRIPT" --model "$TMP/modeldir" --gguf-file m.gguf --prompt-ids "$IDS" --layers 0 --threads 1 \
    --out "$TMP/modeldir/model.safetensors" --overwrite >"$TMP/own.log" 2>&1; then
  fail "kvlab_capture.py wrote over a file of the model directory it reads"
fi
grep -q "is one of the inputs" "$TMP/own.log" || { cat "$TMP/own.log"; fail "no refusal naming the inputs"; }
[ "$(cksum <"$TMP/modeldir/model.safetensors")" = "$before" ] || fail "the refused run changed the model's file"
echo "ok: --out at a file of the model it reads is refused, even with --overwrite"
# a model folder without a tokenizer's files: --prompt was tokenized by whatever transformers returned
# (a 2-token capture, issue 50); refused before the model loads, naming --prompt-ids
TINY="$ROOT/tests/fixtures/tiny_models/llama_linear"
if "$PY" "$SCRIPT" --model "$TINY" --prompt "The quick brown fox" --layers 0 --threads 1 \
    --out "$TMP/notok.h5" >"$TMP/notok.log" 2>&1; then
  fail "kvlab_capture.py captured --prompt with a model that has no tokenizer files"
fi
grep -q "no tokenizer files" "$TMP/notok.log" || { cat "$TMP/notok.log"; fail "no refusal naming the tokenizer files"; }
[ ! -e "$TMP/notok.h5" ] || fail "a refused capture wrote --out"
echo "ok: --prompt on a model without tokenizer files is refused"

# (c) kvlab inspect accepts it
"$KVLAB" inspect "$TMP/py_float32.h5" >"$TMP/inspect.log" 2>&1 || { cat "$TMP/inspect.log"; fail "kvlab inspect"; }
echo "ok: kvlab inspect accepts the Python capture"

# (d) q/k/v and metadata against kvlab dump. Measured (transformers 5.24, torch 2.15, CPU, 1 thread,
# 63 tokens): relative L2 from 2e-7 (layer 0) to 2e-6 (layer 29 v), max abs <= 2.5e-5 on values up to ~15:
# float32 rounding of two implementations (sdpa vs kvlab's attention, different matmul accumulation order)
# growing over 30 layers. 1e-5 relative L2 leaves a margin of 5x at the deepest layer.
"$PY" - "$TMP/kvlab_float32.h5" "$TMP/py_float32.h5" <<'EOF' || fail "q/k/v or metadata differ"
import sys
import h5py
import numpy as np
TOL = 1e-5
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
bad = []
for k in sorted(a.attrs):  # the same attributes, equal but for provenance and the source's name
    if k not in b.attrs:
        bad.append(f"attribute {k} missing")
    elif k not in ("kvlab_version", "git_sha", "source_dataset") and not np.array_equal(a.attrs[k], b.attrs[k]):
        bad.append(f"attribute {k}: {a.attrs[k]!r} vs {b.attrs[k]!r}")
extra = set(b.attrs) - set(a.attrs)
if extra:
    bad.append(f"extra attributes {sorted(extra)}")
sa, sb = a["sample_0000"], b["sample_0000"]
for k in sa.attrs:
    if k != "sample_id" and sa.attrs[k] != sb.attrs[k]:
        bad.append(f"sample attribute {k}: {sa.attrs[k]} vs {sb.attrs[k]}")
if not np.array_equal(sa["tokens"][:], sb["tokens"][:]):
    bad.append("token ids differ")
worst = 0.0
for layer in a.attrs["layers"]:
    for t in "qkv":
        da, db = sa[f"layer_{layer:02d}/{t}"], sb[f"layer_{layer:02d}/{t}"]
        for what in ("shape", "dtype", "chunks", "compression", "compression_opts", "shuffle", "fletcher32"):
            if getattr(da, what) != getattr(db, what):
                bad.append(f"layer {layer} {t}: {what} {getattr(da, what)} vs {getattr(db, what)}")
        x, y = da[:].astype(np.float64), db[:].astype(np.float64)
        if x.shape != y.shape:
            continue
        rel = np.linalg.norm(x - y) / np.linalg.norm(x)
        worst = max(worst, rel)
        print(f"  layer {layer:2d} {t} {list(x.shape)}: max abs {np.abs(x - y).max():.2e}  rel L2 {rel:.2e}")
        if not rel <= TOL:
            bad.append(f"layer {layer} {t}: relative L2 {rel:.2e} > {TOL}")
for m in bad:
    print("  " + m)
print(f"{'ok' if not bad else 'FAILED'}: q/k/v within {TOL} relative L2 of kvlab dump (worst {worst:.2e}); "
      "attributes equal")
sys.exit(1 if bad else 0)
EOF

# (e) replay on both: the same rows. Measured: rel_err, cosine, mass_recall, bound ratios within 3e-6
# relative (kept sets and every count identical); tolerance 1e-5.
for c in kvlab py; do
  "$KVLAB" --threads 1 replay --capture "$TMP/${c}_float32.h5" --method snapkv,streaming_llm --ratio 0.2 \
    --eval-queries last:8 --obs-queries 8 --keep-first 4 --keep-last 8 --seeds 1 --quiet \
    --out "$TMP/replay_$c" >"$TMP/replay_$c.log" 2>&1 || { cat "$TMP/replay_$c.log"; fail "kvlab replay ($c)"; }
done
"$PY" - "$TMP/replay_kvlab/result.json" "$TMP/replay_py/result.json" <<'EOF' || fail "replay rows differ"
import json
import sys
TOL = 1e-5
ra, rb = (json.load(open(p))["rows"] for p in sys.argv[1:3])
bad, worst = [], {}
if len(ra) != len(rb) or not ra:
    bad.append(f"{len(ra)} vs {len(rb)} rows")
for x, y in zip(ra, rb):
    for k in sorted(set(x) | set(y)):
        u, v = x.get(k), y.get(k)
        if k == "compress_ms":  # a timing
            continue
        if isinstance(u, float) or isinstance(v, float):
            d = abs(u - v) / max(abs(u), abs(v), 1e-12)
            worst[k] = max(worst.get(k, 0.0), d)
            if not d <= TOL:
                bad.append(f"{x['method']} layer {x['layer']} head {x['head']}: {k} {u} vs {v}")
        elif u != v:
            bad.append(f"{x['method']} layer {x['layer']} head {x['head']}: {k} {u!r} vs {v!r}")
print(f"  {len(ra)} rows; largest relative difference per field: "
      + ", ".join(f"{k} {d:.1e}" for k, d in sorted(worst.items())))
for m in bad[:20]:
    print("  " + m)
print(f"{'ok' if not bad else 'FAILED'}: replay rows agree within {TOL} (relative), all other fields equal")
sys.exit(1 if bad else 0)
EOF

# (f) bfloat16 storage
capture "$TMP/py_bfloat16.h5" bfloat16 "$LAYERS" || { cat "$TMP/py_bfloat16.h5.log"; fail "kvlab_capture.py --dtype bfloat16"; }
"$KVLAB" inspect "$TMP/py_bfloat16.h5" >"$TMP/inspect_bf16.log" 2>&1 ||
  { cat "$TMP/inspect_bf16.log"; fail "kvlab inspect (bfloat16)"; }
"$PY" - "$TMP/kvlab_bfloat16.h5" "$TMP/py_bfloat16.h5" "$TMP/py_float32.h5" <<'EOF' || fail "bfloat16 capture"
import sys
import h5py
import numpy as np
kb, pb, pf = (h5py.File(p, "r") for p in sys.argv[1:4])


def to_bf16(x):  # float32 -> bfloat16 (round to nearest even, as torch), back as float32
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)


bad, flips, total = [], 0, 0
for layer in pf.attrs["layers"]:
    for t in "qkv":
        name = f"sample_0000/layer_{layer:02d}/{t}"
        if kb[name].id.get_type() != pb[name].id.get_type():  # H5Tequal, as kvlab's reader compares
            bad.append(f"{name}: the file type differs from kvlab dump --dtype bfloat16's")
        y = pb[name][:]  # HDF5 converts the 16-bit type to float32
        if not np.array_equal(y, to_bf16(pf[name][:])):
            bad.append(f"{name}: not the bfloat16 rounding of the float32 capture")
        flips += int((y != kb[name][:]).sum())
        total += y.size
print(f"  bfloat16: {flips} of {total} values differ from kvlab's bfloat16 dump (float32 differences "
      "that cross a rounding boundary)")
if flips > total // 100:
    bad.append("more than 1% of values differ from kvlab's bfloat16 dump")
for m in bad:
    print("  " + m)
print(f"{'ok' if not bad else 'FAILED'}: bfloat16 capture accepted by kvlab inspect, same HDF5 type as kvlab dump, "
      "values the bfloat16 rounding of the float32 capture")
sys.exit(1 if bad else 0)
EOF

# (g) gemma3 (issue 24), where Gemma-3-270M has been fetched (data_scripts/get_gemma3_270m.sh): a
# prompt within the 512-token window, a sliding layer (0) and a global one (5); q/k/v of both tools
# within 1e-5 (gemma3's query_pre_attn_scalar equals head_dim there: no fold). Then a 1,000-token
# prompt: both capture the global layers only (5, 11, 17) under --layers all.
G3=""
for f in "$ROOT"/models/gemma3-270m/*.gguf; do
  if [ -f "$f" ]; then G3="$f"; break; fi
done
if [ -z "$G3" ]; then
  echo "skipped (g): no Gemma-3-270M GGUF under $ROOT/models/gemma3-270m"
else
  "$KVLAB" --threads 1 dump --model "$G3" --prompt "$PROMPT" --chat-template none --layers 0,5 --queries "$QUERIES" \
    --out "$TMP/g3_kvlab.h5" >"$TMP/g3_dump.log" 2>&1 || { cat "$TMP/g3_dump.log"; fail "kvlab dump (gemma3)"; }
  G3IDS=$("$PY" -c "import h5py, sys; print(','.join(map(str, h5py.File(sys.argv[1], 'r')['sample_0000/tokens'][:])))" \
    "$TMP/g3_kvlab.h5") || fail "cannot read the gemma3 dump's token ids"
  "$PY" "$SCRIPT" --model "$G3" --prompt-ids "$G3IDS" --layers 0,5 --queries "$QUERIES" --threads 1 \
    --out "$TMP/g3_py.h5" >"$TMP/g3_py.log" 2>&1 || { cat "$TMP/g3_py.log"; fail "kvlab_capture.py (gemma3)"; }
  "$KVLAB" inspect "$TMP/g3_py.h5" >"$TMP/g3_inspect.log" 2>&1 || { cat "$TMP/g3_inspect.log"; fail "kvlab inspect (gemma3)"; }
  "$PY" - "$TMP/g3_kvlab.h5" "$TMP/g3_py.h5" <<'EOF2' || fail "gemma3 q/k/v differ"
import sys
import h5py
import numpy as np
a, b = (h5py.File(p, "r")["sample_0000"] for p in sys.argv[1:3])
bad = []
for layer in (0, 5):
    for t in "qkv":
        x, y = (f[f"layer_{layer:02d}/{t}"][:].astype(np.float64) for f in (a, b))
        rel = np.linalg.norm(x - y) / np.linalg.norm(x)
        print(f"  gemma3 layer {layer} {t} {list(x.shape)}: rel L2 {rel:.2e}")
        if not rel <= 1e-5:
            bad.append(f"layer {layer} {t}: {rel:.2e}")
print(("FAILED: " + ", ".join(bad)) if bad else "ok: gemma3 q/k/v within 1e-5 relative L2 of kvlab dump")
sys.exit(1 if bad else 0)
EOF2
  LONG=$(head -c 5000 "$ROOT/../shared/data/niah/PaulGrahamEssays/apple.txt" 2>/dev/null || true)
  if [ -n "$LONG" ]; then
    "$KVLAB" --threads 1 dump --model "$G3" --prompt "$LONG" --chat-template none --queries last:4 \
      --out "$TMP/g3_long_kvlab.h5" >"$TMP/g3_long_dump.log" 2>&1 || { cat "$TMP/g3_long_dump.log"; fail "kvlab dump (gemma3, long)"; }
    LIDS=$("$PY" -c "import h5py, sys; print(','.join(map(str, h5py.File(sys.argv[1], 'r')['sample_0000/tokens'][:])))" \
      "$TMP/g3_long_kvlab.h5")
    "$PY" "$SCRIPT" --model "$G3" --prompt-ids "$LIDS" --queries last:4 --threads 1 --out "$TMP/g3_long_py.h5" \
      >"$TMP/g3_long_py.log" 2>&1 || { cat "$TMP/g3_long_py.log"; fail "kvlab_capture.py (gemma3, long)"; }
    for f in g3_long_kvlab g3_long_py; do
      got=$("$PY" -c "import h5py, sys; print(','.join(map(str, h5py.File(sys.argv[1], 'r').attrs['layers'])))" "$TMP/$f.h5")
      [ "$got" = "5,11,17" ] || fail "$f: --layers all on a long prompt captured layers $got, expected the global 5,11,17"
    done
    echo "ok: past the window, both capture gemma3's global layers only (5,11,17)"
  fi
fi

echo "PASS: kvlab_capture.py matches kvlab dump ($(($(date +%s) - START)) s)"
