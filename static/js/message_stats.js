// The line of figures under a finished reply, from its done frame's `timing` and `usage`.

function milliseconds(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(value < 10 ? 1 : 0)} ms`;
}

/** Generation speed after the first token: what a reader sees the text arrive at. */
export function tokensPerSecond(timing, usage) {
  const tokens = usage?.completion_tokens ?? 0;
  if (timing?.tpot_ms > 0) return 1000 / timing.tpot_ms;
  if (tokens > 0 && timing?.e2e_ms > 0) return (tokens * 1000) / timing.e2e_ms;
  return null;
}

function stat(name, label, value, title) {
  const item = document.createElement("span");
  item.className = "stat";
  item.dataset.stat = name;
  item.title = title;
  const labelNode = document.createElement("span");
  labelNode.className = "stat-label";
  labelNode.textContent = label;
  const valueNode = document.createElement("span");
  valueNode.className = "stat-value";
  valueNode.textContent = value;
  item.append(labelNode, " ", valueNode);
  return item;
}

/** A `.message-stats` element for a finished message. */
export function messageStats({ timing, usage }) {
  const stats = document.createElement("span");
  stats.className = "message-stats";
  const rate = tokensPerSecond(timing, usage);
  stats.append(
    stat("ttft", "TTFT", milliseconds(timing?.ttft_ms), "Time to first token"),
    stat("rate", "Speed", rate === null ? "–" : `${rate.toFixed(1)} tok/s`, "Tokens per second after the first"),
    stat("tokens", "Tokens", String(usage?.completion_tokens ?? "–"), "Tokens generated"),
    stat("queue", "Queue", milliseconds(timing?.queue_ms), "Time waiting before the first step"),
    stat(
      "cached",
      "Cached",
      `${timing?.cached_prompt_tokens ?? 0}/${usage?.prompt_tokens ?? "–"}`,
      "Prompt tokens served from the prefix cache / prompt tokens",
    ),
  );
  if (timing?.preemptions) {
    stats.append(stat("preemptions", "Preempted", `${timing.preemptions}×`, "Times the request was preempted"));
  }
  return stats;
}
