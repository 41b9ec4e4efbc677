"""Which model `baton serve` and `baton generate` load and where it runs; each field is also its
flag. Apart from the server's settings, so the offline API resolves a model without the web
stack."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from baton.core.config import LOAD_FORMATS
from baton.core.setting import setting

# The checkpoint tools/train_demo.py trained, shipped inside the package (docs/demo_model.md), so
# `baton serve` answers with no arguments.
DEMO_MODEL = Path(__file__).resolve().parent / "demo_model"
DEMO_MODEL_NAME = "baton-demo"

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """The checkpoint to load and where it runs (baton.gpu.executor resolves auto)."""

    model: str = setting(
        str(DEMO_MODEL),
        help="a Hugging Face checkpoint folder, a GGUF file (or a folder holding one), or a hub "
        "id (ORG/NAME: the local cache's copy, else downloaded; a folder of that name wins)",
        default_text="the built-in demo model",
    )
    revision: str | None = setting(
        None,
        help="the hub model's branch, tag or commit",
        default_text="its default branch",
    )
    download_dir: str | None = setting(
        None,
        help="the cache a hub model is read from and downloaded to",
        default_text="huggingface_hub's: HF_HUB_CACHE, else $HF_HOME/hub",
    )
    load_format: str = setting(
        "auto",
        choices=LOAD_FORMATS,
        help="auto: the checkpoint's weights; dummy: random weights from config.json alone "
        "(--model may be a config file)",
    )
    device: str = setting(
        "auto", choices=DEVICES, help="where the model runs: auto is CUDA where a GPU is visible"
    )
    dtype: str = setting(
        "auto",
        choices=DTYPES,
        help="the model's dtype: auto is float32 on the CPU and bfloat16 on CUDA",
    )
