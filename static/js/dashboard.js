// The live dashboard: polls GET /v1/stats once a second and shows the engine's state and the
// window's latency and SLO figures, as numbers and as charts of the last two minutes on a time axis,
// and each engine replica's row (dashboard_replicas.js).

import { apiFetch } from "./api.js";
import { LineChart } from "./charts.js";
import { showReplicas } from "./dashboard_replicas.js";
import { loadApiKey } from "./store.js";
import { initThemeToggle } from "./theme.js";

const POLL_MS = 1000;
// While the server has no stats endpoint (or refuses the key), ask less often.
const IDLE_POLL_MS = 5000;

const $ = (selector) => document.querySelector(selector);

const number = (digits) => (value) => (isNumber(value) ? value.toFixed(digits) : "–");
const percent = (value) => (isNumber(value) ? `${(value * 100).toFixed(value < 0.1 ? 1 : 0)}%` : "–");
const ms = (value) => {
  if (!isNumber(value)) return "–";
  return value >= 1000 ? `${(value / 1000).toFixed(2)} s` : `${value.toFixed(value < 10 ? 1 : 0)} ms`;
};
const perSecond = (unit) => (value) => (isNumber(value) ? `${value.toFixed(value < 10 ? 1 : 0)} ${unit}/s` : "–");

function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

function duration(seconds) {
  if (!isNumber(seconds)) return "–";
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

const charts = {
  requests: new LineChart($("#chart-requests"), {
    series: [
      { label: "running", color: "--chart-1" },
      { label: "waiting", color: "--chart-2" },
    ],
    format: number(0),
  }),
  kv: new LineChart($("#chart-kv"), { series: [{ label: "in use", color: "--chart-1" }], max: 1, format: percent }),
  steps: new LineChart($("#chart-steps"), {
    series: [
      { label: "prefill", color: "--chart-1" },
      { label: "decode", color: "--chart-2" },
    ],
    format: number(0),
  }),
  ttft: new LineChart($("#chart-ttft"), {
    series: [
      { label: "p50", color: "--chart-1" },
      { label: "p99", color: "--chart-2" },
    ],
    format: ms,
  }),
  tpot: new LineChart($("#chart-tpot"), {
    series: [
      { label: "p50", color: "--chart-1" },
      { label: "p99", color: "--chart-2" },
    ],
    format: ms,
  }),
  slo: new LineChart($("#chart-slo"), { series: [{ label: "attainment", color: "--chart-3" }], max: 1, format: percent }),
  throughput: new LineChart($("#chart-throughput"), {
    series: [
      { label: "generated", color: "--chart-1" },
      { label: "prompt", color: "--chart-2" },
    ],
    format: perSecond("tok"),
  }),
};

function setField(name, text) {
  for (const node of document.querySelectorAll(`[data-field="${name}"]`)) node.textContent = text;
}

/** Show one /v1/stats snapshot; every field may be missing or null. */
export function showStats(stats) {
  const steps = stats.steps ?? {};
  const ttft = stats.ttft_ms ?? {};
  const tpot = stats.tpot_ms ?? {};
  const slo = stats.slo ?? {};
  const throughput = stats.throughput ?? {};
  const totals = stats.totals ?? {};
  setField("model", stats.model ?? "–");
  setField("policy", stats.policy ?? "–");
  setField("uptime", duration(stats.uptime_s));
  setField("total-requests", isNumber(totals.requests) ? String(totals.requests) : "–");
  setField("total-generation-tokens", isNumber(totals.generation_tokens) ? String(totals.generation_tokens) : "–");
  setField("running", number(0)(stats.running));
  setField("waiting", number(0)(stats.waiting));
  setField("requests-finished", number(0)(stats.requests_finished));
  setField("kv-cache", percent(stats.kv_cache_usage));
  setField("prefill-per-step", number(1)(steps.prefill_tokens_per_step));
  setField("decode-per-step", number(1)(steps.decode_tokens_per_step));
  setField("batch-size", number(1)(steps.batch_size));
  setField("step-ms", ms(steps.step_ms_p50));
  // Only a server that speculates reports it (`--speculative-method`): share of draft tokens
  // accepted, and tokens a drafting sequence gained per step.
  const spec = stats.spec_decode ?? null;
  $("#spec-figure").hidden = spec === null;
  setField(
    "spec-decode",
    spec === null || !isNumber(spec.acceptance_rate)
      ? "–"
      : `${percent(spec.acceptance_rate)} · ${number(2)(spec.mean_acceptance_length)} tok a step`,
  );
  setField("ttft-p50", ms(ttft.p50));
  setField("ttft-p99", ms(ttft.p99));
  setField("tpot-p50", ms(tpot.p50));
  setField("tpot-p99", ms(tpot.p99));
  // Attainment and goodput show together or not at all: while no request in the window had a
  // target there is nothing to attain, and "goodput" would only repeat the completion rate.
  const judged = isNumber(slo.attainment);
  setField("slo-attainment", percent(slo.attainment));
  setField("goodput", judged ? perSecond("req")(slo.goodput_rps) : "–");
  $("#slo-hint").hidden = judged || !(stats.requests_finished > 0);
  setField("generation-tps", perSecond("tok")(throughput.generation_tokens_per_s));
  setField("prompt-tps", perSecond("tok")(throughput.prompt_tokens_per_s));
  setField("rps", perSecond("req")(throughput.requests_per_s));
  showReplicas($("#replicas-card"), stats.replicas, stats.kv_transfers);

  charts.requests.push([stats.running, stats.waiting]);
  charts.kv.push([stats.kv_cache_usage]);
  charts.steps.push([steps.prefill_tokens_per_step, steps.decode_tokens_per_step]);
  charts.ttft.push([ttft.p50, ttft.p99]);
  charts.tpot.push([tpot.p50, tpot.p99]);
  charts.slo.push([slo.attainment]);
  charts.throughput.push([throughput.generation_tokens_per_s, throughput.prompt_tokens_per_s]);
}

function setStatus(state, text, problem = null) {
  const status = $("#dash-status");
  status.dataset.state = state;
  status.textContent = text;
  $("#banner").hidden = problem === null;
  $("#banner-text").textContent = problem ?? "";
}

async function poll() {
  let delay = POLL_MS;
  try {
    const response = await apiFetch("/v1/stats", loadApiKey());
    if (response.ok) {
      showStats(await response.json());
      setStatus("open", "Live");
    } else if (response.status === 404) {
      delay = IDLE_POLL_MS;
      setStatus("retrying", "No stats", "This server has no /v1/stats endpoint; update Baton to see the dashboard.");
    } else if (response.status === 401) {
      delay = IDLE_POLL_MS;
      setStatus("unauthorized", "Needs API key", "The server wants an API key: set it in the chat page's settings.");
    } else {
      setStatus("retrying", "Error", `The stats request failed with HTTP ${response.status}.`);
    }
  } catch {
    // Keep the charts moving, with gaps, while the server is away.
    for (const chart of Object.values(charts)) chart.push(chart.series.map(() => null));
    setStatus("retrying", "Offline", "The server is unreachable; retrying every second.");
  }
  setTimeout(poll, delay);
}

initThemeToggle($("#theme-toggle"));
poll();
