"""Hub ids (`baton serve ORG/NAME`): the local cache first, else a download of only the files
serving reads, from a local stand-in for the hub (tests/hub_stand_in.py). Every test points
HF_ENDPOINT at loopback or sets HF_HUB_OFFLINE=1, and HF_HOME at a temporary folder: none
reaches the internet."""

from __future__ import annotations

import importlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from huggingface_hub import constants

from baton.app.cli import main, parse_args
from baton.app.model_settings import DEMO_MODEL, ModelSettings
from baton.app.model_source import resolve_model
from baton.core.checkpoint.checkpoint_check import check_checkpoint
from tests.hub_stand_in import HubRepo, folder_files, running_hub, write_hub_cache
from tests.server_harness import (
    base_url,
    free_port,
    model_engine,
    running_server,
    wait_until_healthy,
)

REPO_ID = "acme/tiny-llama"
MAIN = "1" * 40
V1 = "2" * 40
TOKEN = "hf_stand_in_token"
# Files a repository offers beside a checkpoint that serving must not fetch.
NOT_FOR_SERVING = {
    "pytorch_model.bin": b"\x80 pickled",
    "tiny-llama.Q4_K_M.gguf": b"GGUF",
    "onnx/model.onnx": b"onnx",
    "original/model.safetensors": b"another copy",
    "consolidated.safetensors": b"mistral-inference's copy",
    "README.md": b"# tiny",
}
# What huggingface_hub reads from its environment, set afresh by every test.
HUB_VARIABLES = (
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_TOKEN",
    "HF_HUB_DISABLE_XET",
    "HF_HUB_DISABLE_TELEMETRY",
)


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """`hub_env(HF_ENDPOINT=...)` sets huggingface_hub's environment for this test, its home in
    tmp_path; the previous one comes back after. huggingface_hub reads it once, at import, so
    its constants are read again as a fresh process would."""

    def configure(**variables: str) -> dict[str, str]:
        for name in HUB_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        env = {
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            **variables,
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        importlib.reload(constants)
        return env

    yield configure
    monkeypatch.undo()
    importlib.reload(constants)


# A named chat template, where transformers saves one: in a folder, which serving reads.
NAMED_TEMPLATE = {"additional_chat_templates/tool_use.jinja": b"{{ messages[0].content }}"}


@pytest.fixture(scope="module")
def checkpoint_files(llama_checkpoint) -> dict[str, bytes]:
    return {**folder_files(llama_checkpoint), **NAMED_TEMPLATE}


@pytest.fixture
def hub(checkpoint_files):
    """The stand-in hub: the tiny checkpoint at two commits (main, tag v1) beside files serving
    never reads, and a gated copy."""
    offered = {**checkpoint_files, **NOT_FOR_SERVING}
    without_weights = {k: v for k, v in checkpoint_files.items() if k != "model.safetensors"}
    repos = {
        REPO_ID: HubRepo({MAIN: offered, V1: offered}, {"main": MAIN, "v1": V1}),
        "acme/gated": HubRepo({MAIN: offered}, {"main": MAIN}, gated_token=TOKEN),
        "acme/pickled": HubRepo({MAIN: {**without_weights, **NOT_FOR_SERVING}}, {"main": MAIN}),
    }
    with running_hub(repos) as stand_in:
        yield stand_in


def closed_port_url() -> str:
    """An address nothing listens on: the hub out of reach."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def hub_model(**settings) -> ModelSettings:
    return ModelSettings(model=settings.pop("model", REPO_ID), **settings)


def test_a_hub_id_downloads_only_the_files_serving_reads(hub, hub_env, checkpoint_files, capfd):
    hub_env(HF_ENDPOINT=hub.url)

    source = resolve_model(hub_model())

    assert source.name == REPO_ID
    assert source.folder == Path(constants.HF_HUB_CACHE, "models--acme--tiny-llama/snapshots", MAIN)
    assert folder_files(source.folder) == checkpoint_files
    assert hub.requested_files() == set(checkpoint_files)
    assert not any(name in line for line in hub.requests for name in NOT_FOR_SERVING)
    assert (
        source.origin == f"the hub's {REPO_ID} at revision 1111111, downloaded to {source.folder}"
    )
    check_checkpoint(source.folder)
    # Not a terminal: no progress bar in the output.
    assert "Fetching" not in capfd.readouterr().err


def test_download_dir_and_revision_choose_the_cache_and_the_commit(hub, hub_env, tmp_path):
    hub_env(HF_ENDPOINT=hub.url)
    cache = tmp_path / "models"

    source = resolve_model(hub_model(revision="v1", download_dir=str(cache)))

    assert source.folder == cache / "models--acme--tiny-llama" / "snapshots" / V1
    assert (cache / "models--acme--tiny-llama" / "refs" / "v1").read_text() == V1
    assert all(f"/resolve/{V1}/" in line for line in hub.requests if "/resolve/" in line)
    assert not Path(constants.HF_HUB_CACHE).exists()
    assert "at revision v1 (2222222), downloaded to" in source.origin


def test_a_cached_model_is_served_without_asking_the_hub(hub, hub_env):
    hub_env(HF_ENDPOINT=hub.url)
    downloaded = resolve_model(hub_model())
    hub.requests.clear()

    again = resolve_model(hub_model())

    assert hub.requests == []
    assert again.folder == downloaded.folder
    assert again.origin.endswith(f"from the local cache, {downloaded.folder}")


def test_a_cache_holding_part_of_a_model_is_completed_from_the_hub(hub, hub_env, checkpoint_files):
    env = hub_env(HF_ENDPOINT=hub.url)
    # What transformers' AutoConfig leaves in a cache: config.json alone.
    cache = Path(env["HF_HOME"], "hub")
    write_hub_cache(cache, REPO_ID, MAIN, {"config.json": checkpoint_files["config.json"]})

    source = resolve_model(hub_model())

    assert folder_files(source.folder) == checkpoint_files
    assert "downloaded to" in source.origin


def test_offline_a_cache_laid_out_by_huggingface_hub_is_read(hub_env, tmp_path, checkpoint_files):
    cache = tmp_path / "hub-cache"
    snapshot = write_hub_cache(cache, REPO_ID, MAIN, checkpoint_files)
    hub_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_url())

    source = resolve_model(hub_model())

    assert (source.folder, source.name) == (snapshot, REPO_ID)
    assert (
        source.origin
        == f"the hub's {REPO_ID} at revision 1111111, from the local cache, {snapshot}"
    )


def test_a_local_folder_wins_over_a_hub_id(hub_env, tmp_path, monkeypatch, llama_checkpoint):
    hub_env(HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_url())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "tiny-llama").symlink_to(llama_checkpoint)

    source = resolve_model(hub_model())

    assert source.folder == Path(REPO_ID)
    assert source.origin == f"the folder {REPO_ID}"


def generate_error(model: str, capsys) -> str:
    """The one line `baton generate MODEL` prints before it exits 2, without a traceback."""
    code = main(["generate", model, "--prompt", "hi"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def test_a_repository_the_hub_does_not_have_is_one_line_naming_it(hub, hub_env, capsys):
    hub_env(HF_ENDPOINT=hub.url)

    line = generate_error("acme/no-such-model", capsys)

    assert line == (
        f"baton: error: acme/no-such-model is neither a local folder nor a model on the hub "
        f"({hub.url}): check the spelling; a private model needs HF_TOKEN set to a token that "
        "can read it"
    )


def test_a_revision_the_hub_does_not_have_is_named(hub, hub_env, capsys):
    hub_env(HF_ENDPOINT=hub.url)

    code = main(["generate", REPO_ID, "--revision", "v9", "--prompt", "hi"])

    assert code == 2
    assert f"{REPO_ID} has no revision 'v9': --revision takes a branch" in capsys.readouterr().err


def test_a_gated_model_asks_for_hf_token_and_downloads_with_it(hub, hub_env, capsys):
    hub_env(HF_ENDPOINT=hub.url)
    line = generate_error("acme/gated", capsys)
    assert line == (
        f"baton: error: acme/gated is gated: accept its licence at {hub.url}/acme/gated, then "
        "set HF_TOKEN to a token of the account that accepted it"
    )

    hub_env(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN)
    source = resolve_model(hub_model(model="acme/gated"))

    assert (source.folder / "model.safetensors").is_file()


def test_a_model_without_safetensors_weights_says_so(hub, hub_env, capsys):
    hub_env(HF_ENDPOINT=hub.url)

    line = generate_error("acme/pickled", capsys)

    assert line == (
        "baton: error: acme/pickled at its default branch has no *.safetensors weights: Baton "
        "serves checkpoints with config.json and *.safetensors weights"
    )
    assert "pytorch_model.bin" not in hub.requested_files()


def test_offline_a_model_not_in_the_cache_says_so(hub_env, capsys):
    env = hub_env(HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_url())

    line = generate_error(REPO_ID, capsys)

    cache = Path(env["HF_HOME"], "hub")
    assert line == (
        f"baton: error: {REPO_ID} is not in the local cache ({cache}) and HF_HUB_OFFLINE=1 "
        "forbids downloading it: unset HF_HUB_OFFLINE, or point HF_HUB_CACHE or --download-dir "
        "at a cache that holds it"
    )


def test_offline_a_model_cached_in_part_names_what_it_lacks(hub_env, checkpoint_files, capsys):
    env = hub_env(HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_url())
    cache = Path(env["HF_HOME"], "hub")
    write_hub_cache(cache, REPO_ID, MAIN, {"config.json": checkpoint_files["config.json"]})

    line = generate_error(REPO_ID, capsys)

    assert line.startswith(
        f"baton: error: {REPO_ID} lacks *.safetensors weights in the local cache ({cache}) and "
        "HF_HUB_OFFLINE=1 forbids downloading it"
    )


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_the_model_may_be_given_as_a_positional_argument(command):
    extra = ["--prompt", "hi"] if command == "generate" else []

    assert parse_args([command, REPO_ID, *extra]).model == REPO_ID
    assert parse_args([command, REPO_ID, "--model", REPO_ID, *extra]).model == REPO_ID
    assert parse_args([command, *extra]).model == str(DEMO_MODEL)


def test_a_positional_model_and_a_different_model_flag_are_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(["serve", REPO_ID, "--model", "./elsewhere"])
    assert exited.value.code == 2
    assert (
        f"the model is given twice, as MODEL ({REPO_ID}) and --model (./elsewhere)"
        in capsys.readouterr().err
    )


def baton(*args: str, env: dict[str, str], **options) -> subprocess.Popen:
    """`baton ARGS` in a subprocess with huggingface_hub's environment `env` and no other."""
    clean = {k: v for k, v in os.environ.items() if k not in HUB_VARIABLES}
    command = [sys.executable, "-m", "baton.app.cli", *args]
    return subprocess.Popen(command, env={**clean, **env}, text=True, **options)


def test_serve_with_the_hub_out_of_reach_exits_with_one_error_line(hub_env):
    env = hub_env(HF_ENDPOINT=closed_port_url())
    process = baton("serve", REPO_ID, "--port", "0", env=env, stderr=subprocess.PIPE)

    _, err = process.communicate(timeout=120)

    assert process.returncode == 2
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    assert line == (
        f"baton: error: {REPO_ID} is not in the local cache ({env['HF_HOME']}/hub) and the hub "
        f"({env['HF_ENDPOINT']}) could not be reached: check the network, or HF_ENDPOINT if it "
        "is set"
    )


def test_a_folder_start_never_imports_huggingface_hub():
    code = (
        "import sys\n"
        "from baton.app.model_source import resolve_model\n"
        "from baton.app.model_settings import ModelSettings\n"
        "import baton.app.cli\n"
        "resolve_model(ModelSettings())\n"
        "print('huggingface_hub' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert result.stdout.strip() == "False", result.stderr


def completion(url: str, model: str) -> str:
    body = {"model": model, "prompt": "The for statement", "max_tokens": 12, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


@pytest.mark.slow
def test_serve_org_name_from_the_cache_serves_exactly_what_the_folder_does(
    hub_env, tmp_path, llama_checkpoint, checkpoint_files
):
    cache = tmp_path / "hub-cache"
    snapshot = write_hub_cache(cache, REPO_ID, MAIN, checkpoint_files)
    env = hub_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", HF_ENDPOINT=closed_port_url())
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = baton(
            "serve",
            REPO_ID,
            "--device",
            "cpu",
            "--port",
            str(port),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, port, log)
        models = httpx.get(f"{url}/v1/models").json()["data"]
        served = completion(url, REPO_ID)
    finally:
        process.terminate()
        process.wait(timeout=60)

    assert [model["id"] for model in models] == [REPO_ID]
    with running_server(model_engine(llama_checkpoint)) as state:
        assert served == completion(base_url(state), "tiny")
    assert re.search(
        rf"loaded the hub's {REPO_ID} at revision 1111111, from the local cache, {snapshot} "
        r"\(LlamaForCausalLM",
        log.read_text(),
    ), log.read_text()
