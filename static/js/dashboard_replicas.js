// The dashboard's Replicas card (`baton serve --replicas N`): one row per engine replica from
// /v1/stats's `replicas`, shown only when there are two or more (a single engine's figures are
// the other cards). Rows are built with textContent: node names come from the cluster.

const percent = (value) => (typeof value === "number" && Number.isFinite(value) ? `${Math.round(value * 100)}%` : "–");
const count = (value) => (typeof value === "number" && Number.isFinite(value) ? String(value) : "–");

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
];

/** Show `replicas` (the stats snapshot's list; may be missing) in `card`'s table body. */
export function showReplicas(card, replicas) {
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
}
