#!/usr/bin/env python3
"""Writes the seed tests/fixtures/fuzz_corpus/fuzz_capture/oom_tiny_chunks.h5: a valid capture
(python/kvlab_capture.py's writer, so every attribute and header is what kvlab writes) whose q/k/v
are chunked [1, 1, 1] and never written, so they read as zeros: 38 KB of file, 65,536 chunks in k.
The class of input behind fuzz_short's out-of-memory in CI (HDF5 keeps a record of every chunk a
read touches; the CI input itself was not kept). Needs h5py and numpy.
  python3 fuzz/make_oom_tiny_chunks.py OUT [N_TOKENS=8192] [HEAD_DIM=8] [CHUNK=1,1,1] [DTYPE=float16]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvlab_capture as kc  # noqa: E402

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
d = int(sys.argv[3]) if len(sys.argv) > 3 else 8
chunk = tuple(int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1,1,1").split(","))
dtype = sys.argv[5] if len(sys.argv) > 5 else "float16"


def create_unwritten(self, group, name, t):
    """The writer's dataset (same type and filters) in CHUNK-sized chunks, no data written."""
    shape = t.shape  # [heads, n, head_dim]
    dcpl = self.h5p.create(self.h5p.DATASET_CREATE)
    dcpl.set_chunk(tuple(min(c, s) for c, s in zip(chunk, shape)))
    dcpl.set_shuffle()
    dcpl.set_deflate(1)
    dcpl.set_fletcher32()
    self.h5d.create(group, name.encode(), self.ftype, self.h5s.create_simple(shape), dcpl=dcpl)


kc.CaptureWriter._write_tensor = create_unwritten
meta = dict(architecture="llama", dtype=dtype, git_sha="none", head_dim=d, kvlab_version="none", layers=[0],
            model_id="tiny-chunks", n_kv_heads=1, n_layers=1, n_q_heads=1, queries="last:1", rope_scaling="null",
            rope_theta=10000.0, source_dataset="none")
w = kc.CaptureWriter(out, meta)
w.begin_sample("s0", np.zeros(n, np.int32), 1)
w.write_layer(0, np.zeros((1, 1, d)), np.zeros((1, n, d)), np.zeros((1, n, d)))
w.end_sample()
w.finish()
