// The dashboard's Replicas card (`baton serve --replicas N`): one row per engine replica from
// /v1/stats's `replicas`, with its role and the KV transfers it received (`--prefill-replicas`),
// shown only when there are two or more (a single engine's figures are the other cards). Rows
// are built with textContent: node names come from the cluster.

const percent = (value) => (typeof value === "number" && Number.isFinite(value) ? `${Math.round(value * 100)}%` : "–");
const count = (value) => (typeof value === "number" && Number.isFinite(value) ? String(value) : "–");

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** Bytes in the largest binary unit that keeps the number at 1 or more. */
function bytes(value) {
  if (typeof value !== "number" || !Number.isFinite(value)) return "–";
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}

const ms = (value) => (typeof value === "number" && Number.isFinite(value) ? `${value.toFixed(1)} ms` : "–");

/** Transfers as "count · bytes · mean", or "–" before any. */
function transfers(totals) {
  if (!totals || !(totals.count > 0)) return "–";
  const failed = totals.failed > 0 ? ` (${totals.failed} failed)` : "";
  return `${totals.count}${failed} · ${bytes(totals.bytes)} · ${ms(totals.mean_ms)}`;
}

/** The prefix cache's hit rate over the prompt tokens it looked up, or "–" before any. */
function hitRate(replica) {
  const queries = replica.prefix_cache_queries;
  return queries > 0 ? percent(replica.prefix_cache_hits / queries) : "–";
}

// Column order of the card's table head (dashboard.html).
const COLUMNS = [
  (r) => count(r.id),
  (r) => r.node ?? "–",
  (r) => count(r.pid),
  (r) => (r.healthy ? "serving" : "restarting"),
  (r) => count(r.running),
  (r) => count(r.waiting),
  (r) => percent(r.kv_cache_usage),
  (r) => count(r.requests_in_flight),
  (r) => count(r.requests_routed),
  (r) => count(r.requests_finished),
  hitRate,
  (r) => r.role ?? "–",
  (r) => transfers(r.kv_transfers),
];

/** Show `replicas` (the stats snapshot's list; may be missing) in `card`'s table body, and
 * `totals` (its `kv_transfers`) among the card's figures. */
export function showReplicas(card, replicas, totals) {
  const list = Array.isArray(replicas) ? replicas : [];
  card.hidden = list.length < 2;
  const body = card.querySelector("tbody");
  const rows = list.map((replica) => {
    const row = document.createElement("tr");
    row.dataset.replica = String(replica.id);
    row.dataset.state = replica.healthy ? "serving" : "restarting";
    for (const cell of COLUMNS) {
      const td = document.createElement("td");
      td.textContent = cell(replica);
      row.append(td);
    }
    return row;
  });
  body.replaceChildren(...rows);
  const down = list.filter((replica) => !replica.healthy).length;
  card.querySelector("[data-field=replicas-serving]").textContent = list.length ? `${list.length - down} of ${list.length}` : "–";
  card.querySelector("[data-field=kv-transfers]").textContent = transfers(totals);
}
