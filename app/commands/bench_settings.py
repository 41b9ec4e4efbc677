"""`baton bench`'s own settings: the server to measure, where its requests come from, at what
rate, and where the results go; its flags are the fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from baton.app.commands.load_settings import LoadSettings
from baton.core.setting import setting

# Prompts sent from a random or synthetic dataset when --num-prompts is not given.
DEFAULT_NUM_PROMPTS = 100


@dataclass(frozen=True, slots=True)
class BenchSettings:
    base_url: str = setting("http://127.0.0.1:8000", help="the server to benchmark")
    model: str | None = setting(
        None, help="the model name requests ask for", default_text="the server's first"
    )
    endpoint: str = setting(
        "completions",
        choices=("completions", "chat"),
        help="stream /v1/completions or /v1/chat/completions",
    )
    dataset: str = setting(
        "random",
        choices=("random", "synthetic-chat", "trace"),
        help="the requests: random lengths (--input-len, --output-len), --workload's classes "
        "(synthetic-chat), or --trace-file's rows (trace)",
    )
    trace_file: str | None = setting(
        None,
        metavar="PATH",
        help="trace: JSONL rows (arrival_s, prompt_tokens, output_tokens, optional ttft_ms, "
        "tpot_ms, priority, class) or the Azure LLM inference trace CSV, replayed at its own "
        "arrival times unless --request-rate is given",
        default_text="none",
    )
    input_len: int = setting(128, help="random: prompt words")
    output_len: int = setting(64, help="random: max_tokens")
    range_ratio: float = setting(0.0, help="random: lengths vary by ± this share")
    slo_classes: bool = setting(
        False,
        help="synthetic-chat, trace: count goodput against each request's own SLO targets (its "
        "class's; a trace row's, or its named class's)",
    )
    send_slo: bool = setting(
        False,
        help="send each request's slo and priority (Baton's extension; other servers refuse it)",
    )
    num_prompts: int | None = setting(
        None,
        help="requests to send; trace: its first rows",
        default_text=f"{DEFAULT_NUM_PROMPTS}; trace: all",
    )
    request_rate: str | None = setting(
        None,
        help="requests per second, or a comma-separated list to sweep (inf: all at once)",
        default_text="inf; a trace's own arrival times for --dataset trace",
    )
    token_prompts: bool = setting(
        False,
        help="completions: send each prompt as that many random token ids rather than words, so "
        "the server sees exactly the lengths a trace or workload gives (as the simulator does)",
    )
    max_concurrency: int | None = setting(
        None, help="requests in flight at most", default_text="no limit"
    )
    goodput: list[str] = setting(
        default_factory=list,
        nargs="+",
        metavar="METRIC:MS",
        help="SLO for goodput, e.g. ttft:500 tpot:50 e2el:10000",
    )
    timeout: float = setting(
        600.0, help="seconds a request waits for the server's next bytes before it fails"
    )
    label: str | None = setting(None, help="a name for this run in the JSON", default_text="none")
    result_json: str | None = setting(
        None, help="write the results here", default_text="not written"
    )
    plot: str | None = setting(
        None, help="write a PNG of the latency CDFs here", default_text="no plot"
    )
    # Shared with `baton simulate` and set from its flags; `ignore_eos` is the request field's
    # flag (baton.core.sampling_params).
    load: LoadSettings = field(default_factory=LoadSettings)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError("--num-prompts must be >= 1")
        if self.token_prompts and self.endpoint == "chat":
            raise ValueError(
                "--token-prompts sends token ids, which only --endpoint completions takes"
            )
        if (self.dataset == "trace") != (self.trace_file is not None):
            raise ValueError("--dataset trace and --trace-file PATH go together")
