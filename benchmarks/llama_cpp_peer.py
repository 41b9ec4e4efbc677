"""llama.cpp's `llama-server` as a peer to measure Baton against: built from the
`llama-cpp-python` source distribution (which vendors llama.cpp whole), Hugging Face checkpoints
converted to GGUF by llama.cpp's own converter. Everything is cached under `peers_dir()`.

    python benchmarks/llama_cpp_peer.py build [native|avx2]
    python benchmarks/llama_cpp_peer.py convert CHECKPOINT_DIR OUT_DIR [f32|q8_0]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
GGUF_KINDS = ("f32", "q8_0")

# The compiler flags that keep AMX out of a native build: on an AMX CPU ggml 0.3.36's AMX weight
# repacking crashes the Q8_0 server right after loading, while its AVX-512 VNNI repacking serves
# (docs/decisions.md, Measuring). On CPUs without AMX the flags change nothing.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# CPU-only, one static binary; nothing fetched at build time (no curl, no HTTPS, no prebuilt
# web UI: only package registries are reachable here).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
# The instructions a build uses, each in a build folder of its own: "native" is tuned for this
# CPU (AMX aside); "avx2" is AVX2, FMA and F16C without AVX-512, the set of an AVX2-only CPU
# such as the AMD EPYC (Zen 3) VMs, so a machine with AVX-512 can also measure that code path.
ISA_OPTIONS = {
    "native": ("-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"),
    "avx2": (
        "-DGGML_NATIVE=OFF",
        *("-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"),
        *("-DGGML_AVX_VNNI=OFF", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF"),
    ),
}
ISAS = tuple(ISA_OPTIONS)
TARGETS = ("llama-server", "llama-quantize")


def peers_dir() -> Path:
    """The cache of peer builds and converted models ($BATON_PEERS, else ~/.cache/baton-peers)."""
    return Path(os.environ.get("BATON_PEERS") or Path.home() / ".cache" / "baton-peers")


def source_dir(peers: Path) -> Path:
    return peers / f"llama.cpp-{LLAMA_CPP_PYTHON}"


def build_dir(source: Path, isa: str = "native") -> Path:
    return source / ("build" if isa == "native" else f"build-{isa}")


def binary(peers: Path, name: str, isa: str = "native") -> Path:
    return build_dir(source_dir(peers), isa) / "bin" / name


def fetch_source(peers: Path) -> Path:
    """llama.cpp's tree as vendored by the llama-cpp-python sdist, downloaded once."""
    source = source_dir(peers)
    if source.is_dir():
        return source
    peers.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=peers) as scratch:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--no-binary", ":all:", "--dest", scratch),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            ],
            check=True,
        )
        (archive,) = Path(scratch).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        vendored = Path(scratch) / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
        # Renamed into place last, so an interrupted download leaves no half tree behind.
        vendored.rename(source)
    return source


def cmake_configure_command(source: Path, isa: str = "native") -> list[str]:
    options = (*CMAKE_OPTIONS, *ISA_OPTIONS[isa])
    return ["cmake", "-S", str(source), "-B", str(build_dir(source, isa)), *options]


def cmake_build_command(
    source: Path, jobs: int, isa: str = "native", targets: tuple[str, ...] = TARGETS
) -> list[str]:
    folder = str(build_dir(source, isa))
    return ["cmake", "--build", folder, "--target", *targets, f"-j{jobs}"]


def ensure_cmake() -> None:
    if shutil.which("cmake"):
        return
    if os.geteuid() != 0:
        raise RuntimeError("cmake is not installed: install it (apt-get install cmake) and rerun")
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "cmake"], check=True, stdout=subprocess.DEVNULL
    )


def build(
    peers: Path, jobs: int | None = None, isa: str = "native", targets: tuple[str, ...] = TARGETS
) -> Path:
    """`targets` (`llama-server` and `llama-quantize`) for `isa`, built once; returns the first
    one's path."""
    if isa not in ISA_OPTIONS:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    if all(binary(peers, name, isa).is_file() for name in targets):
        return binary(peers, targets[0], isa)
    source = fetch_source(peers)
    ensure_cmake()
    log = peers / ("build.log" if isa == "native" else f"build-{isa}.log")
    with log.open("w") as out:
        for command in (
            cmake_configure_command(source, isa),
            cmake_build_command(source, jobs or os.cpu_count() or 1, isa, targets),
        ):
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode:
                tail = "\n".join(log.read_text().splitlines()[-20:])
                raise RuntimeError(f"building llama.cpp failed ({' '.join(command)}):\n{tail}")
    return binary(peers, targets[0], isa)


def pre_tokenizer_label(spec: dict) -> str | None:
    """llama.cpp's name for the pre-tokenizer of a `tokenizer.json`, where its converter's list
    of known tokenizer hashes has no entry: byte-level BPE splitting with GPT-2's pattern and
    nothing in front (what `baton.tools.tokenizer_trainer` writes) is llama.cpp's "gpt-2"; None for
    any other, which the converter then refuses as before."""
    pre = spec.get("pre_tokenizer") or {}
    gpt2_split = (
        pre.get("type") == "ByteLevel"
        and not pre.get("add_prefix_space", False)
        and pre.get("use_regex", True)
    )
    return "gpt-2" if gpt2_split and spec.get("normalizer") is None else None


def converter_deps(peers: Path) -> Path:
    """What the converter imports beyond this interpreter's packages: sentencepiece, which
    its Llama vocabulary probe imports before looking for a tokenizer.model."""
    deps = peers / "convert-deps"
    if not (deps / "sentencepiece").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--target",
                str(deps),
                "sentencepiece",
            ],
            check=True,
        )
    return deps


def convert(peers: Path, checkpoint: Path, out_dir: Path, kind: str = "f32") -> Path:
    """`out_dir/{checkpoint name}-{kind}.gguf`, made once: F32 by llama.cpp's converter, Q8_0
    from the F32 one by `llama-quantize`, as llama.cpp's users make them."""
    if kind not in GGUF_KINDS:
        raise ValueError(f"kind must be one of {', '.join(GGUF_KINDS)}, got {kind!r}")
    out = out_dir / f"{checkpoint.name}-{kind}.gguf"
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    # Written under another name and renamed when complete, so a killed run leaves no file
    # that a later one would take for finished.
    partial = out.with_name(out.name + ".partial")
    if kind == "f32":
        build(peers)
        command = [
            *(sys.executable, __file__, "_run-converter", str(source_dir(peers))),
            *(str(converter_deps(peers)), str(checkpoint), str(partial)),
        ]
    else:
        f32 = convert(peers, checkpoint, out_dir, "f32")
        command = [str(binary(peers, "llama-quantize")), str(f32), str(partial), "Q8_0"]
    log = peers / f"convert-{kind}.log"
    with log.open("w") as output:
        if subprocess.run(command, stdout=output, stderr=subprocess.STDOUT).returncode:
            tail = "\n".join(log.read_text().splitlines()[-20:])
            raise RuntimeError(f"converting {checkpoint} to {kind} failed:\n{tail}")
    partial.rename(out)
    return out


def run_converter(
    source: Path, deps: Path, checkpoint: Path, out: Path, outtype: str = "f32"
) -> None:
    """In a process of its own: llama.cpp's `convert_hf_to_gguf.py` to `outtype` (f32, f16, bf16
    or q8_0), with one fallback added for tokenizers whose hash it does not know
    (`pre_tokenizer_label`)."""
    sys.path[:0] = [str(deps), str(source), str(source / "gguf-py")]
    import convert_hf_to_gguf
    from conversion.base import TextModel

    by_hash = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(model: TextModel, tokenizer) -> str:
        try:
            return by_hash(model, tokenizer)
        except NotImplementedError:
            spec = json.loads((Path(model.dir_model) / "tokenizer.json").read_text())
            label = pre_tokenizer_label(spec)
            if label is None:
                raise
            return label

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", str(checkpoint), "--outtype", outtype]
    sys.argv += ["--outfile", str(out)]
    convert_hf_to_gguf.main()


def llama_server_command(
    server: Path, model: Path, port: int, slots: int, context_per_slot: int, threads: int
) -> list[str]:
    """`llama-server` serving `model` with one slot per stream, each holding `context_per_slot`
    tokens, continuous batching on, `threads` for decode and for prompt batches alike."""
    return [
        *(str(server), "--model", str(model), "--host", "127.0.0.1", "--port", str(port)),
        *("--threads", str(threads), "--threads-batch", str(threads)),
        *("--parallel", str(slots), "--ctx-size", str(slots * context_per_slot)),
        # Each slot its own KV cache of context_per_slot tokens, so --ctx-size is split evenly.
        *("--no-kv-unified", "--cont-batching", "--no-webui"),
    ]


def main(argv: list[str]) -> None:
    peers = peers_dir()
    match argv:
        case ["build", *isa] if len(isa) <= 1:
            print(build(peers, isa=isa[0] if isa else "native"))
        case ["convert", checkpoint, out_dir, *kind] if len(kind) <= 1:
            print(convert(peers, Path(checkpoint), Path(out_dir), *kind))
        case ["_run-converter", source, deps, checkpoint, out, *outtype] if len(outtype) <= 1:
            run_converter(Path(source), Path(deps), Path(checkpoint), Path(out), *outtype)
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
