"""A weightless checkpoint folder for `--load-format dummy`: a config file and a small tokenizer."""

from __future__ import annotations

from pathlib import Path


def write_config_folder(config_file: str | Path, out: str | Path) -> Path:
    """`config_file` as `out`/config.json plus a 512-token tokenizer from
    `baton.tools.tokenizer_trainer`
    (ids past its vocabulary decode to nothing)."""
    from baton.tools.tokenizer_trainer import (
        train_tokenizer,  # trained only when a folder is written
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(Path(config_file).read_text())
    train_tokenizer(512).save_pretrained(out)
    return out
