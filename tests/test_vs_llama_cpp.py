"""`benchmarks/vs_llama_cpp.py` without llama.cpp: both servers' command lines sized from one
shape, the converter's pre-tokenizer fallback (through a stand-in converter), GGUF caching, the
report's medians, ratios and token checks, and one real measurement of a Baton server."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import llama_cpp_peer  # noqa: E402
import vs_llama_cpp  # noqa: E402
from vs_llama_cpp_report import (  # noqa: E402
    Measurement,
    markdown,
    ratios,
    renumbered,
    spreads,
    summarize,
    token_notes,
)

DEMO_TOKENIZER = BENCHMARKS.parent / "app" / "demo_model" / "tokenizer.json"


def measurement(side: str, round_: int, tok_s: float, ttft: float, tpot: float, **fields):
    values = dict(
        side=side,
        prompt_len=40,
        streams=8,
        round=round_,
        output_tok_s=tok_s,
        ttft_p50_ms=ttft,
        tpot_p50_ms=tpot,
        completed=16,
        failed=0,
        prompt_tokens_per_request=41.0,
        output_tokens_per_request=128.0,
        cold_start_s=1.0,
        peak_rss_mib=500.0,
        load_1min=2.0,
    )
    return Measurement(**(values | fields))


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_baton_tokenizer_is_labelled_gpt2_and_others_are_refused():
    spec = json.loads(DEMO_TOKENIZER.read_text())
    assert llama_cpp_peer.pre_tokenizer_label(spec) == "gpt-2"
    byte_level = spec["pre_tokenizer"]
    for changed in (
        {"pre_tokenizer": byte_level | {"add_prefix_space": True}},
        {"pre_tokenizer": byte_level | {"use_regex": False}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}},
        {"normalizer": {"type": "NFC"}},
    ):
        assert llama_cpp_peer.pre_tokenizer_label(spec | changed) is None


def test_converter_falls_back_to_the_label_only_for_unknown_hashes(tmp_path):
    """A stand-in for llama.cpp's converter whose hash table knows nothing: the patched method
    answers "gpt-2" for Baton's tokenizer and still refuses one it cannot name."""
    source = tmp_path / "llama.cpp"
    (source / "conversion").mkdir(parents=True)
    (source / "gguf-py").mkdir()
    (source / "conversion" / "__init__.py").write_text("")
    (source / "conversion" / "base.py").write_text(
        textwrap.dedent(
            """
            class TextModel:
                def __init__(self, dir_model):
                    self.dir_model = dir_model

                def get_vocab_base_pre(self, tokenizer):
                    raise NotImplementedError("BPE pre-tokenizer was not recognized")
            """
        )
    )
    (source / "convert_hf_to_gguf.py").write_text(
        textwrap.dedent(
            """
            import sys
            from pathlib import Path
            from conversion.base import TextModel

            def main():
                model, out = sys.argv[1], Path(sys.argv[sys.argv.index("--outfile") + 1])
                out.write_text(TextModel(model).get_vocab_base_pre(None))
            """
        )
    )
    known, unknown = tmp_path / "known", tmp_path / "unknown"
    known.mkdir()
    unknown.mkdir()
    spec = json.loads(DEMO_TOKENIZER.read_text())
    (known / "tokenizer.json").write_text(json.dumps(spec))
    (unknown / "tokenizer.json").write_text(json.dumps(spec | {"normalizer": {"type": "NFC"}}))

    def run(checkpoint: Path) -> subprocess.CompletedProcess:
        command = [sys.executable, llama_cpp_peer.__file__, "_run-converter", str(source)]
        command += [str(tmp_path / "deps"), str(checkpoint), str(checkpoint / "out")]
        return subprocess.run(command, capture_output=True, text=True)

    assert run(known).returncode == 0
    assert (known / "out").read_text() == "gpt-2"
    refused = run(unknown)
    assert refused.returncode != 0 and "was not recognized" in refused.stderr


def test_converted_gguf_is_reused_without_building(tmp_path, monkeypatch):
    def no_build(peers):
        raise AssertionError("built although the GGUF was there")

    monkeypatch.setattr(llama_cpp_peer, "build", no_build)
    checkpoint = tmp_path / "llama-bench"
    done = tmp_path / "gguf" / "llama-bench-q8_0.gguf"
    done.parent.mkdir()
    done.write_bytes(b"GGUF")
    assert llama_cpp_peer.convert(tmp_path, checkpoint, tmp_path / "gguf", "q8_0") == done
    with pytest.raises(ValueError, match="f32, q8_0"):
        llama_cpp_peer.convert(tmp_path, checkpoint, tmp_path / "gguf", "q4_0")


def test_build_is_cpu_only_static_and_fetches_nothing():
    command = llama_cpp_peer.cmake_configure_command(Path("/src"))
    assert command[:5] == ["cmake", "-S", "/src", "-B", "/src/build"]
    for option in ("-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"):
        assert option in command
    assert "-DBUILD_SHARED_LIBS=OFF" in command and "-DCMAKE_BUILD_TYPE=Release" in command
    # Native, but without the AMX path whose Q8_0 repacking crashed the server.
    assert "-DGGML_NATIVE=ON" in command
    for language in ("C", "CXX"):
        flags = next(o for o in command if o.startswith(f"-DCMAKE_{language}_FLAGS="))
        assert "-mno-amx-int8" in flags.split("=", 1)[1].split()
    build = llama_cpp_peer.cmake_build_command(Path("/src"), 2)
    assert build[-4:] == ["--target", "llama-server", "llama-quantize", "-j2"]


def test_an_avx2_build_has_its_own_folder_and_no_avx512():
    command = llama_cpp_peer.cmake_configure_command(Path("/src"), "avx2")
    assert command[:5] == ["cmake", "-S", "/src", "-B", "/src/build-avx2"]
    assert {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF"} <= set(
        command
    )
    assert "-DGGML_NATIVE=ON" not in command and "-DLLAMA_CURL=OFF" in command
    assert llama_cpp_peer.cmake_build_command(Path("/src"), 2, "avx2")[2] == "/src/build-avx2"
    peers = Path("/peers")
    assert llama_cpp_peer.binary(peers, "llama-server", "avx2").parent.parent.name == "build-avx2"
    with pytest.raises(ValueError, match="native, avx2"):
        llama_cpp_peer.build(peers, isa="avx512")


def test_an_avx2_run_holds_batons_kernels_and_torch_to_avx2(monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/ext")
    native, avx2 = vs_llama_cpp.child_env(2, "native"), vs_llama_cpp.child_env(2, "avx2")
    assert native["TORCH_EXTENSIONS_DIR"] == "/ext" and "BATON_CPU_MARCH" not in native
    assert avx2["TORCH_EXTENSIONS_DIR"] == "/ext-avx2"  # never the native build's folder
    assert avx2["BATON_CPU_MARCH"] == "x86-64-v3" and avx2["ATEN_CPU_CAPABILITY"] == "avx2"
    assert vs_llama_cpp.parse_args(["--isa", "avx2"]).isa == "avx2"


def test_shape_sizes_context_for_prompt_and_answer():
    assert vs_llama_cpp.Shape(40, 1, 128, 2).context_per_sequence == 256  # 50 + 144 = 194
    assert vs_llama_cpp.Shape(256, 8, 128, 2).context_per_sequence == 512  # 320 + 144 = 464
    assert vs_llama_cpp.Shape(512, 8, 128, 2).context_per_sequence == 896  # 640 + 144 = 784
    assert vs_llama_cpp.Shape(40, 1, 128, 2).num_prompts == 4
    assert vs_llama_cpp.Shape(40, 32, 128, 2).num_prompts == 64


def test_both_servers_are_sized_alike_for_a_shape():
    shape = vs_llama_cpp.Shape(256, 8, 128, 2)
    llama = vs_llama_cpp.Side("llama.cpp F32", Path("m.gguf"), llama_server=Path("bin/server"))
    command = vs_llama_cpp.server_command(llama, shape, 8179, threads=2)
    assert command[:3] == ["bin/server", "--model", "m.gguf"]
    assert flag(command, "--port") == "8179"
    assert flag(command, "--threads") == flag(command, "--threads-batch") == "2"
    assert flag(command, "--parallel") == "8" and flag(command, "--ctx-size") == str(8 * 512)
    assert {"--no-kv-unified", "--cont-batching"} <= set(command)

    baton = vs_llama_cpp.Side("baton+args", Path("ckpt"), baton_args=("--quantization", "int8"))
    command = vs_llama_cpp.server_command(baton, shape, 8179, threads=2)
    assert command[1:4] == ["-m", "baton.app.cli", "serve"]
    assert flag(command, "--max-num-seqs") == "8" and flag(command, "--max-model-len") == "512"
    assert flag(command, "--cpu-threads") == "2"
    assert command[-2:] == ["--quantization", "int8"]
    assert vs_llama_cpp.child_env(2)["OMP_NUM_THREADS"] == "2"


def test_each_baton_side_gets_its_own_serve_flags():
    f32_flags, int8_flags = (
        "--f32-baton-args=--kv-cache-dtype float16",
        "--baton-args=--quantization int8",
    )
    args = vs_llama_cpp.parse_args(["--checkpoint", "ckpt", "--gguf", f32_flags, int8_flags])
    baton, variant = vs_llama_cpp.sides(args)
    assert baton.baton_args == ("--kv-cache-dtype", "float16")
    assert variant.baton_args == ("--quantization", "int8")
    assert vs_llama_cpp.sides(vs_llama_cpp.parse_args(["--checkpoint", "ckpt", "--gguf"]))[0] == (
        vs_llama_cpp.Side("baton", Path("ckpt"))
    )


def test_every_side_gets_the_same_client_run():
    command = vs_llama_cpp.bench_command(vs_llama_cpp.Shape(40, 32, 128, 2), 8179, seed=3)
    assert flag(command, "--input-len") == "40" and flag(command, "--output-len") == "128"
    assert flag(command, "--num-prompts") == "64" and flag(command, "--max-concurrency") == "32"
    assert flag(command, "--seed") == "3" and "--ignore-eos" in command


def test_summary_takes_medians_over_rounds_and_ratios_divide_them():
    runs = [
        measurement("baton", 0, 300.0, 40.0, 20.0),
        measurement("baton", 1, 340.0, 60.0, 24.0),
        measurement("llama.cpp F32", 0, 200.0, 100.0, 10.0),
        measurement("llama.cpp F32", 1, 200.0, 80.0, 12.0),
    ]
    baton, llama = summarize(runs)
    assert (baton.output_tok_s, baton.ttft_p50_ms, baton.tpot_p50_ms) == (320.0, 50.0, 22.0)
    assert baton.output_tok_s_each == (300.0, 340.0) and baton.rounds == 2
    (row,) = ratios([baton, llama], "baton", "llama.cpp F32", runs)
    assert row["output_tok_s"] == pytest.approx(1.6)
    assert row["ttft_p50_ms"] == pytest.approx(50 / 90)
    assert row["tpot_p50_ms"] == pytest.approx(2.0)
    assert row["output_tok_s_by_round"] == pytest.approx([1.5, 1.7])
    assert ratios([baton, llama], "baton+args", "llama.cpp Q8_0", runs) == []
    table = markdown([baton, llama], [row])
    assert (
        "| 40 | 8 | 320.0 (50 / 22.0) | 200.0 (90 / 11.0) | **1.60×** (rounds 1.50–1.70, TTFT 0.56×"
        in table
    )


def test_ratios_also_divide_each_rounds_own_pair():
    # The machine was slower in round 1, and both sides' figures fell.
    runs = [
        measurement("baton", 0, 300.0, 40.0, 20.0),
        measurement("llama.cpp F32", 0, 200.0, 100.0, 10.0),
        measurement("baton", 1, 100.0, 40.0, 20.0),
        measurement("llama.cpp F32", 1, 100.0, 100.0, 10.0),
        measurement("llama.cpp F32", 2, 100.0, 100.0, 10.0),  # baton's round 2 failed
    ]
    summaries = summarize(runs)
    (row,) = ratios(summaries, "baton", "llama.cpp F32", runs)
    assert row["output_tok_s"] == pytest.approx(200 / 100)
    assert row["output_tok_s_by_round"] == pytest.approx([1.5, 1.0])
    assert "**2.00×** (rounds 1.00–1.50, TTFT 0.40×" in markdown(summaries, [row])


def test_pooled_runs_pair_rounds_only_within_their_own_run():
    first = [
        measurement("baton", 0, 300.0, 40.0, 20.0),
        measurement("llama.cpp F32", 0, 200.0, 1, 1),
    ]
    second = [
        measurement("llama.cpp F32", 0, 100.0, 1, 1),
        measurement("baton", 1, 120.0, 1, 1),
        measurement("llama.cpp F32", 1, 100.0, 1, 1),
    ]
    pooled = renumbered([first, second])
    assert [m.round for m in pooled] == [0, 0, 1, 2, 2]
    (row,) = ratios(summarize(pooled), "baton", "llama.cpp F32", pooled)
    assert row["output_tok_s_by_round"] == pytest.approx([1.5, 1.2])


def test_pool_reads_earlier_reports_and_measures_nothing(tmp_path, monkeypatch):
    def report(path: Path, runs: list[Measurement], output_len: int = 128) -> Path:
        body = {
            "settings": {"output_len": str(output_len)},
            "measurements": [asdict(m) for m in runs],
        }
        path.write_text(json.dumps(body))
        return path

    monkeypatch.setattr(vs_llama_cpp, "measure", lambda *a: pytest.fail("measured"))
    a = report(
        tmp_path / "a.json",
        [measurement("baton", 0, 300.0, 40, 20), measurement("llama.cpp F32", 0, 200.0, 80, 10)],
    )
    b = report(
        tmp_path / "b.json",
        [measurement("baton", 0, 100.0, 40, 20), measurement("llama.cpp F32", 0, 100.0, 80, 10)],
    )
    out = tmp_path / "pooled.json"
    vs_llama_cpp.main(["--pool", str(a), str(b), "--json", str(out)])
    pooled = json.loads(out.read_text())
    assert pooled["pooled"] == [str(a), str(b)]
    assert [m["round"] for m in pooled["measurements"]] == [0, 0, 1, 1]
    (row,) = pooled["ratios"]
    assert row["output_tok_s"] == pytest.approx(200 / 150)
    assert row["output_tok_s_by_round"] == pytest.approx([1.5, 1.0])
    again = tmp_path / "again.json"
    vs_llama_cpp.main(["--pool", str(out), str(a), "--json", str(again)])
    assert [m["round"] for m in json.loads(again.read_text())["measurements"]] == [0, 0, 1, 1, 2, 2]
    c = report(tmp_path / "c.json", [measurement("baton", 0, 1.0, 1, 1)], output_len=64)
    with pytest.raises(SystemExit, match="different output lengths"):
        vs_llama_cpp.main(["--pool", str(a), str(c)])


def test_notes_name_short_answers_failures_and_prompt_length_differences():
    summaries = summarize(
        [
            measurement("baton", 0, 300.0, 40.0, 20.0),
            measurement("llama.cpp F32", 0, 200.0, 100.0, 10.0, prompt_tokens_per_request=42.0),
            measurement("llama.cpp Q8_0", 0, 200.0, 100.0, 10.0, output_tokens_per_request=97.5),
            measurement("baton+args", 0, 1.0, 1.0, 1.0, failed=3),
        ]
    )
    notes = token_notes(summaries, output_len=128)
    assert notes == [
        "llama.cpp Q8_0, prompt 40, 8 streams: 97.5 output tokens a request, not 128",
        "baton+args, prompt 40, 8 streams: 3 requests failed",
        "prompt 40, 8 streams: prompt tokens differ (baton 41, llama.cpp F32 42, "
        "llama.cpp Q8_0 41, baton+args 41)",
    ]


@pytest.mark.slow
def test_measures_a_real_baton_server_end_to_end(llama_checkpoint, tmp_path, monkeypatch):
    from torch.utils.cpp_extension import get_default_build_root

    # The kernels the rest of the suite builds, not a build of this test's own.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", get_default_build_root())
    args = argparse.Namespace(
        threads=2, port=8197, seed=0, start_timeout=600.0, log_dir=tmp_path, isa="native"
    )
    shape = vs_llama_cpp.Shape(prompt_len=12, streams=2, output_len=6, requests_per_stream=2)
    m = vs_llama_cpp.measure(vs_llama_cpp.Side("baton", llama_checkpoint), shape, 0, args)
    assert (m.completed, m.failed) == (4, 0)
    assert m.output_tokens_per_request == 6
    assert m.prompt_tokens_per_request >= 12  # a word is a token or more, plus BOS
    assert m.output_tok_s > 0 and m.ttft_p50_ms > 0 and m.tpot_p50_ms > 0
    assert 0 < m.cold_start_s < 120 and m.peak_rss_mib > 50


def test_spreads_tell_a_round_the_cores_went_elsewhere_from_one_that_worked_more():
    # The slow round: 1,422 then 945 tok/s, while the server's CPU per token held.
    runs = [
        measurement("baton", 0, 1422.0, 100.0, 5.0, cpu_ms_per_token=2.0),
        measurement("baton", 1, 945.0, 150.0, 8.0, cpu_ms_per_token=2.1),
    ]
    (summary,) = summarize(runs)
    assert summary.cpu_ms_per_token_each == (2.0, 2.1)
    row = spreads([summary]).splitlines()[2]
    assert row == "| baton | 40 | 8 | 1422.0, 945.0 | 50% | 2.00, 2.10 | 5% | 2.84, 1.98 |"
