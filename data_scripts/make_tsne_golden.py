#!/usr/bin/env python3
"""Writes tests/fixtures/tsne_golden/: the t-SNE and trustworthiness goldens of lib/kvlab/analysis,
computed by PyPI scikit-learn (the reference kvlab's t-SNE reimplements).

  keys.f32     float32 little-endian [n, d]: a slice of real post-RoPE keys (one layer, one KV head,
               every `stride`-th token) read from a kvlab capture with h5py
  golden.json  {n, d, source, perplexity, seed, sklearn_version, and per method ("exact",
               "barnes_hut"): trustworthiness(k=10) of sklearn.manifold.TSNE's embedding, its KL
               divergence, and the embedding itself [n, 2] (so kvlab's trustworthiness can be
               checked on exactly sklearn's output); plus trustworthiness of fixed projections
               (the first two coordinates, k = 5 and 10) as exact checks of the metric}

Run (scikit-learn 1.9.1, numpy, h5py in a venv):
  python3 -m venv /tmp/sk-venv && /tmp/sk-venv/bin/pip install scikit-learn numpy h5py
  /tmp/sk-venv/bin/python data_scripts/make_tsne_golden.py --capture CAPTURE.h5 [--layer 14] \
      [--head 0] [--n 400] [--stride 8] [--start 100]
The committed golden came from captures/smollm2_longeval200_main.h5 (configs/main.json's dump:
SmolLM2-135M-Instruct, LongEval 200 lines, sample 0, 4,425 tokens), layer 14, KV head 0.
"""
import argparse
import json
import os

import h5py
import numpy as np
import sklearn
from sklearn.manifold import TSNE, trustworthiness


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture", required=True)
    ap.add_argument("--layer", type=int, default=14)
    ap.add_argument("--head", type=int, default=0)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--stride", type=int, default=8)
    ap.add_argument("--start", type=int, default=100)
    ap.add_argument("--perplexity", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures",
                                                  "tsne_golden"))
    a = ap.parse_args()

    with h5py.File(a.capture, "r") as f:
        k = f[f"sample_0000/layer_{a.layer:02d}/k"][a.head]  # [n_tokens, head_dim]
    stop = a.start + a.n * a.stride
    if stop > k.shape[0]:
        raise SystemExit(f"--start {a.start} + --n {a.n} x --stride {a.stride} = {stop} > {k.shape[0]} tokens")
    x = np.ascontiguousarray(k[a.start:stop:a.stride], dtype=np.float32)  # [n, d]
    os.makedirs(a.out, exist_ok=True)
    x.astype("<f4").tofile(os.path.join(a.out, "keys.f32"))

    golden = {
        "n": int(x.shape[0]), "d": int(x.shape[1]),
        "source": {"capture": os.path.basename(a.capture), "layer": a.layer, "kv_head": a.head,
                   "tokens": f"{a.start}:{stop}:{a.stride}", "tensor": "k"},
        "perplexity": a.perplexity, "seed": a.seed, "sklearn_version": sklearn.__version__,
        "numpy_version": np.__version__,
        "projection_trustworthiness": {
            "first2_k5": float(trustworthiness(x, x[:, :2], n_neighbors=5)),
            "first2_k10": float(trustworthiness(x, x[:, :2], n_neighbors=10)),
            "dims_10_12_k10": float(trustworthiness(x, x[:, 10:12], n_neighbors=10)),
        },
    }
    for method in ("exact", "barnes_hut"):
        ts = TSNE(n_components=2, perplexity=a.perplexity, method=method, random_state=a.seed, init="pca",
                  learning_rate="auto", early_exaggeration=12.0, max_iter=1000, angle=0.5)
        y = ts.fit_transform(x.astype(np.float64))
        golden[method] = {
            "trustworthiness_k10": float(trustworthiness(x, y, n_neighbors=10)),
            "kl_divergence": float(ts.kl_divergence_),
            "n_iter": int(ts.n_iter_),
            "embedding": [[round(float(v), 6) for v in row] for row in y],
        }
        print(method, "trustworthiness(k=10) =", golden[method]["trustworthiness_k10"],
              "KL =", golden[method]["kl_divergence"])
    with open(os.path.join(a.out, "golden.json"), "w") as f:
        json.dump(golden, f)
        f.write("\n")


if __name__ == "__main__":
    main()
