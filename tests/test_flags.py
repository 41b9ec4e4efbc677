"""Every flag is one setting's: a dataclass field declared once, from which baton.app.flags makes
the argparse argument, with help that ends in its default, and builds the settings back."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass

import pytest

from baton.app.cli import (
    MODEL,
    REPLICAS,
    SAMPLING,
    build_parser,
    engine_config_from,
    server_settings_from,
)
from baton.app.commands import simulate
from baton.app.flags import FlagGroup
from baton.app.model_settings import ModelSettings
from baton.app.replicas.replica_settings import ReplicaSettings
from baton.app.settings import ServerSettings
from baton.core.config import POLICIES, EngineConfig
from baton.core.sampling_params import SamplingParams
from baton.core.scheduling.policy_registry import POLICY_CLASSES
from baton.core.setting import setting

# Option strings two settings share. Each pair means different things and never meets on one
# command, so neither could be the other's field.
HOMONYMS = {
    # The checkpoint to load; the model name a benchmark asks a server for.
    "--model": {"ModelSettings.model", "BenchSettings.model"},
    # The engine's sampling generator; the drawn workload's lengths and arrivals.
    "--seed": {"EngineConfig.seed", "LoadSettings.seed"},
    # The keys a server requires (repeatable); the one key a client sends.
    "--api-key": {"ServerSettings.api_keys", "LoadSettings.api_key"},
    # A number of tokens; simulate's rule for setting them (class, exact or a number).
    "--max-tokens": {"SamplingParams.max_tokens", "SimulateSettings.max_tokens"},
    # The one router a server uses; the comma-separated routers a simulation compares.
    "--router": {"ReplicaSettings.router", "SimulateSettings.router"},
}


def subcommands(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> dict[str, argparse.ArgumentParser]:
    """Every command by its words (`kernels build`), the ones nested under another included."""
    found = {}
    for action in (parser or build_parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                nested = subcommands(command, f"{prefix}{name} ")
                found |= nested or {f"{prefix}{name}": command}
    return found


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options but -h."""
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_every_subcommand_is_walked() -> None:
    assert set(subcommands()) == {
        "generate",
        "serve",
        "simulate",
        "bench",
        "kernels build",
        "kernels status",
    }
    # One flag from each of serve's groups: the walk reaches every group a command adds.
    serve_flags = {
        option for action in flags(subcommands()["serve"]) for option in action.option_strings
    }
    assert {"--model", "--max-num-seqs", "--port", "--replicas"} <= serve_flags


def test_every_flag_of_every_subcommand_has_help_that_ends_in_its_default() -> None:
    missing = []
    for name, parser in subcommands().items():
        formatter = parser._get_formatter()
        for action in flags(parser):
            text = formatter._expand_help(action) if action.help else ""
            if (
                not re.search(r"\S.* \((default: \S.*|required)\)$", text)
                or "(default: None" in text
            ):
                missing.append(f"baton {name} {action.option_strings[0]}: {text!r}")

    assert not missing, "\n".join(missing)


def test_every_flag_is_made_from_one_field_and_no_field_twice() -> None:
    declared = defaultdict(set)
    loose = []
    for name, parser in subcommands().items():
        for action in flags(parser):
            field = getattr(action, "setting", None)
            if field is None:
                loose.append(f"baton {name} {action.option_strings[0]}")
            for option in action.option_strings:
                declared[option].add(field)

    assert not loose, "flags declared by hand, not from a settings field: " + ", ".join(loose)
    assert {option: fields for option, fields in declared.items() if len(fields) > 1} == HOMONYMS


def test_a_flag_serve_and_simulate_share_is_the_same_field_with_the_same_help() -> None:
    commands = subcommands()
    serve = {a.option_strings[0]: a for a in flags(commands["serve"])}
    simulated = {a.option_strings[0]: a for a in flags(commands["simulate"])}
    shared = sorted(set(serve) & set(simulated) - set(HOMONYMS))

    assert shared == [
        "--block-size",
        "--device",
        "--disaggregate",
        "--kv-growth-forecast",
        "--kv-transfer-gbps",
        "--kv-transfer-latency-ms",
        "--max-num-batched-tokens",
        "--max-num-seqs",
        "--max-preemptions",
        "--max-wait-ms",
        "--migrate",
        "--num-kv-blocks",
        "--num-speculative-tokens",
        "--prefill-replicas",
        "--replicas",
        "--slo-admission-factor",
        "--speculative-method",
    ]
    for option in shared:
        assert serve[option].setting == simulated[option].setting
        assert (
            serve[option].help.split(" (default:")[0]
            == simulated[option].help.split(" (default:")[0]
        )


def test_flag_defaults_are_the_settings_defaults(monkeypatch) -> None:
    monkeypatch.delenv("BATON_API_KEY", raising=False)
    served = parse("serve")

    assert engine_config_from(served) == EngineConfig()
    assert server_settings_from(served) == ServerSettings()
    assert REPLICAS.build(served) == ReplicaSettings()
    assert MODEL.build(served) == ModelSettings()
    # A bare `baton generate` writes more than a request's default number of tokens.
    assert SAMPLING.build(parse("generate", "--prompt", "hi")) == SamplingParams(max_tokens=64)
    # A simulated KV cache has no memory to be sized from.
    assert simulate.ENGINE.build(parse("simulate")).num_kv_blocks == 8192
    simulated = {a.option_strings[0]: a for a in flags(subcommands()["simulate"])}
    assert simulated["--num-kv-blocks"].help.endswith("(default: 8192)")


def test_flags_parse_into_their_settings(monkeypatch) -> None:
    monkeypatch.delenv("BATON_API_KEY", raising=False)
    args = parse(
        "serve",
        "--kv-cache-memory",
        "4GiB",
        "--no-enable-prefix-caching",
        "--allowed-origins",
        "http://a.test, http://b.test",
        "--api-key",
        "one",
        "--api-key",
        "two",
        "--shutdown-timeout",
        "2.5",
        "--replicas",
        "3",
    )

    config = engine_config_from(args)
    settings = server_settings_from(args)
    assert (config.kv_cache_memory_bytes, config.enable_prefix_caching) == (4 * 2**30, False)
    assert settings.allowed_origins == ["http://a.test", "http://b.test"]
    assert (settings.api_keys, settings.shutdown_timeout_s) == (["one", "two"], 2.5)
    assert REPLICAS.build(args).num_replicas == 3


def test_the_api_key_falls_back_to_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("BATON_API_KEY", "from-env")

    assert server_settings_from(parse("serve")).api_keys == ["from-env"]
    assert server_settings_from(parse("serve", "--api-key", "given")).api_keys == ["given"]


def test_an_unreadable_size_is_refused_with_what_to_change(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("serve", "--kv-cache-memory", "lots")

    assert "--kv-cache-memory must be a byte count or a size with a unit" in capsys.readouterr().err


@dataclass
class Toy:
    on: bool = setting(True, help="on unless turned off")
    off: bool = setting(False, help="off unless turned on")
    names: list[str] = setting(default_factory=list, repeatable=True, help="a name")
    share: float = setting(0.5, help="a share in %")
    count: int | None = setting(None, help="how many", default_text="as many as there are")
    hidden: int = 7


def toy_parser(group: FlagGroup) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    group.add_to(parser)
    return parser


def test_switches_on_by_default_take_no_and_those_off_by_default_do_not() -> None:
    parser = toy_parser(FlagGroup(Toy, "toy"))
    options = {option for action in flags(parser) for option in action.option_strings}

    assert {"--on", "--no-on", "--off"} <= options and "--no-off" not in options
    assert "--hidden" not in options
    built = FlagGroup(Toy, "toy").build(parser.parse_args(["--no-on", "--off", "--names", "a"]))
    assert built == Toy(on=False, off=True, names=["a"], hidden=7)


def test_help_shows_the_default_in_words_or_as_its_value() -> None:
    text = toy_parser(FlagGroup(Toy, "toy", defaults={"share": 0.25})).format_help()

    assert "a share in % (default: 0.25)" in text
    assert "how many (default: as many as there are)" in text
    assert "a name (default: none)" in text
    assert "off unless turned on (default: off)" in text


def test_a_setting_whose_default_is_none_must_say_what_none_means() -> None:
    @dataclass
    class Unsaid:
        limit: int | None = setting(None, help="a limit")

    with pytest.raises(TypeError, match="says what None means"):
        toy_parser(FlagGroup(Unsaid, "unsaid"))


def test_a_group_naming_a_field_that_is_no_flag_is_refused() -> None:
    with pytest.raises(TypeError, match="Toy has no flag field hidden"):
        toy_parser(FlagGroup(Toy, "toy", only=("on", "hidden")))


def test_the_config_names_the_registered_policies_in_order() -> None:
    assert tuple(POLICY_CLASSES) == POLICIES


def test_the_engine_config_loads_without_the_scheduling_policies() -> None:
    code = "import sys, json, baton.core.config; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

    loaded = json.loads(result.stdout)
    assert "baton.core.config" in loaded
    assert not [name for name in loaded if name.startswith("baton.core.scheduling")]
