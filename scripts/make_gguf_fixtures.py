"""Make the GGUF files tests/test_gguf.py reads, with llama.cpp's own tools, from tiny random
checkpoints (baton.tools.random_checkpoint, seeded); tests/data/gguf/fixtures.json records how.

llama.cpp's converter (convert_hf_to_gguf.py, Python) writes F32, F16, BF16 and Q8_0 itself;
Q4_0 and Q4_K_M come from its `llama-quantize` (C++, built once: the `gguf` package has no K-quant
quantizer, and llama-quantize picks each tensor's type as the files people download have them).
Both come from the llama-cpp-python sdist, through benchmarks/llama_cpp_peer.py, cached under
$BATON_PEERS (default ~/.cache/baton-peers).

    .venv/bin/python scripts/make_gguf_fixtures.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import llama_cpp_peer  # noqa: E402

FIXTURES = REPO / "tests" / "data" / "gguf"
# The checkpoints converted, as write_checkpoint(out, family, "tiny", seed, **overrides) makes
# them. "tiny" is the tests' usual Llama; K-quant blocks span 256 values of a row, so "wide"
# has rows of 256 (hidden and intermediate size) to quantize as Q4_K and Q6_K rather than fall
# back to other types, in one layer and with tied embeddings to stay small.
SOURCES = {
    "tiny": dict(family="llama", seed=0, overrides={}),
    "wide": dict(
        family="llama",
        seed=0,
        overrides=dict(
            hidden_size=256, intermediate_size=256, num_hidden_layers=1, tie_word_embeddings=True
        ),
    ),
}
# file -> (source, tool, type): the converter's --outtype, or llama-quantize's type (from an
# F32 file, as llama.cpp recommends). Q4_K_M holds Q4_K and Q6_K tensors both.
FILES = {
    "tiny-f32.gguf": ("tiny", "convert", "f32"),
    "tiny-f16.gguf": ("tiny", "convert", "f16"),
    "tiny-bf16.gguf": ("tiny", "convert", "bf16"),
    "tiny-q8_0.gguf": ("tiny", "convert", "q8_0"),
    "tiny-q4_0.gguf": ("tiny", "quantize", "Q4_0"),
    "wide-q4_k_m.gguf": ("wide", "quantize", "Q4_K_M"),
}


def convert(peers: Path, checkpoint: Path, out: Path, outtype: str) -> None:
    """llama.cpp's converter in a process of its own (it patches its own modules)."""
    source = llama_cpp_peer.source_dir(peers)
    deps = llama_cpp_peer.converter_deps(peers)
    command = [sys.executable, llama_cpp_peer.__file__, "_run-converter", str(source), str(deps)]
    subprocess.run([*command, str(checkpoint), str(out), outtype], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args()
    from baton.tools.random_checkpoint import write_checkpoint

    peers = llama_cpp_peer.peers_dir()
    llama_cpp_peer.fetch_source(peers)
    quantize = llama_cpp_peer.build(peers, targets=("llama-quantize",))
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoints = {
            name: write_checkpoint(
                Path(scratch) / name, spec["family"], "tiny", spec["seed"], **spec["overrides"]
            )
            for name, spec in SOURCES.items()
        }
        for name, checkpoint in checkpoints.items():
            convert(peers, checkpoint, Path(scratch) / f"{name}-f32.gguf", "f32")
        for file, (source, tool, kind) in FILES.items():
            out = args.out / file
            if tool == "convert":
                convert(peers, checkpoints[source], out, kind)
            else:
                f32 = Path(scratch) / f"{source}-f32.gguf"
                subprocess.run([str(quantize), str(f32), str(out), kind], check=True)
            print(f"{out}: {out.stat().st_size // 1024} KiB")
    manifest = {
        "made_by": "scripts/make_gguf_fixtures.py",
        "llama_cpp_python": llama_cpp_peer.LLAMA_CPP_PYTHON,
        "sources": {name: {**spec, "preset": "tiny"} for name, spec in SOURCES.items()},
        "files": {
            file: {"source": source, "tool": tool, "type": kind}
            for file, (source, tool, kind) in FILES.items()
        },
    }
    (args.out / "fixtures.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
