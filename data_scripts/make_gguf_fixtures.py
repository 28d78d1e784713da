#!/usr/bin/env python3
"""Writes the small GGUF golden files used by tests/model/test_weights.cpp.

Run (from the repository root, with the packages of data_scripts/requirements.txt):
    /opt/kvlab-py/bin/python data_scripts/make_gguf_fixtures.py
Outputs (committed, each < 100 KB), all under tests/fixtures/gguf/:
    quants.gguf                  GGUF v3: one tensor per ggml type kvlab dequantizes (F32, F16, BF16,
                                 Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
                                 Q6_K; odd row counts, a 3-D one),
                                 metadata of every value type incl. nested arrays, llama.* hparams
                                 and a small tokenizer.ggml.* vocabulary.
    quants.expected.safetensors  float32 reference values from gguf.quants.dequantize (numpy), same
                                 tensor names, row-major shapes (GGUF dims reversed).
    aligned64.gguf               general.alignment = 64, an F32 and a Q8_0 tensor.
Deterministic: fixed seed. The C++ test compares kvlab's dequantization with the reference values.
"""
import json
import pathlib
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
rng = np.random.default_rng(1234)


def write_safetensors(path, tensors):
    """Minimal safetensors writer (F32 only), so the fixture needs no extra package."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def random_kquant_bytes(qtype, rows, cols):
    """Random K-quant blocks (gguf-py cannot quantize these) with sane fp16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.05, size=(n_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:      # fp16 d, fp16 dmin at the start
        raw[:, 0:4] = scales
    elif qtype == Q.Q6_K:    # fp16 d at the end
        raw[:, 208:210] = scales[:, 0:2]
    elif qtype == Q.Q5_K:    # fp16 d, fp16 dmin at the start
        raw[:, 0:4] = scales
    elif qtype == Q.Q3_K:    # fp16 d at the end
        raw[:, 108:110] = scales[:, 0:2]
    elif qtype == Q.Q2_K:    # fp16 d, fp16 dmin at the end
        raw[:, 80:84] = scales
    return raw.reshape(rows, cols // block * size)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(OUT / "quants.gguf"), "llama")
    expected = {}

    # Row-major numpy shapes; GGUF stores them reversed (ne0 = last numpy dim).
    for name, qtype, shape in [
        ("t.q8_0", Q.Q8_0, (3, 96)),
        ("t.q4_0", Q.Q4_0, (5, 64)),
        ("t.q4_1", Q.Q4_1, (7, 32)),
        ("t.q5_0", Q.Q5_0, (3, 64)),
        ("t.q5_1", Q.Q5_1, (3, 64)),
        ("t.q4_1_3d", Q.Q4_1, (2, 3, 64)),
    ]:
        x = rng.standard_normal(shape).astype(np.float32)
        x[0, ..., :5] = [0.0, 1.0, -1.0, 7.5, -8.25]  # a few exact values
        q = gguf.quants.quantize(x, qtype)             # uint8 [..., bytes per row]
        w.add_tensor(name, q, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(q, qtype).reshape(shape)

    for name, qtype, shape in [("t.q4_k", Q.Q4_K, (3, 256)), ("t.q6_k", Q.Q6_K, (2, 512)),
                               ("t.q5_k", Q.Q5_K, (2, 256)), ("t.q3_k", Q.Q3_K, (2, 256)),
                               ("t.q2_k", Q.Q2_K, (3, 256))]:
        q = random_kquant_bytes(qtype, *shape)
        w.add_tensor(name, q, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(q, qtype).reshape(shape)

    f32 = rng.standard_normal((5, 7)).astype(np.float32)
    w.add_tensor("t.f32", f32)
    expected["t.f32"] = f32
    f16 = rng.standard_normal((2, 3, 5)).astype(np.float16)
    w.add_tensor("t.f16", f16)
    expected["t.f16"] = f16.astype(np.float32)
    bf = rng.standard_normal((4, 6)).astype(np.float32)
    bf_bits = (bf.view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact in bf16
    w.add_tensor("t.bf16", bf_bits.view(np.uint8).reshape(4, 12), raw_dtype=Q.BF16)
    expected["t.bf16"] = (bf_bits.astype(np.uint32) << 16).view(np.float32)
    vec = rng.standard_normal(33).astype(np.float32)      # 1-D, e.g. a norm weight
    w.add_tensor("t.vec", vec)
    expected["t.vec"] = vec

    # Metadata of every value type.
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 2**40 + 3)
    w.add_int64("test.i64", -(2**40) - 3)
    w.add_float32("test.f32", 0.25)
    w.add_float64("test.f64", -1.5e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo ✓")
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_f32", [0.5, -0.25])
    w.add_array("test.arr_str", ["a", "", "ü"])
    w.add_array("test.arr_nested", [[1, 2], [3]])
    # llama hyperparameters (the names the model helper reads).
    w.add_name("kvlab-fixture")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(172)
    w.add_head_count(8)
    w.add_head_count_kv(4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    # A tiny vocabulary.
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "▁a", "<0x0A>"])
    w.add_token_scores([0.0, 0.0, 0.0, -1.5, -2.0])
    w.add_token_types([2, 3, 3, 1, 6])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{{ bos_token }}")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_safetensors(OUT / "quants.expected.safetensors", expected)

    w = gguf.GGUFWriter(str(OUT / "aligned64.gguf"), "llama")
    w.add_custom_alignment(64)
    a = np.arange(10, dtype=np.float32).reshape(2, 5)
    w.add_tensor("a.f32", a)
    b = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("b.q8_0", gguf.quants.quantize(b, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    for p in sorted(OUT.iterdir()):
        print(f"{p}  {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
