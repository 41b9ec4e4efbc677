// How the page talks to Baton besides the socket: fetches that carry the API key, the key as
// WebSocket subprotocols (browsers cannot set headers on a socket), and error wording.

/** GET `path` with `Authorization: Bearer KEY` when a key is set. */
export function apiFetch(path, key, init = {}) {
  const headers = new Headers(init.headers);
  if (key) headers.set("Authorization", `Bearer ${key}`);
  return fetch(path, { ...init, headers, cache: "no-store" });
}

/** The subprotocols to offer: `baton`, and the key as `baton.bearer.KEY` (see app/security.py). */
export function keyProtocols(key) {
  return key ? ["baton", `baton.bearer.${key}`] : ["baton"];
}

/** What to tell a person about an OpenAI-shaped error object. */
export function describeError(error) {
  const detail = error?.message ?? "Unknown error.";
  switch (error?.type) {
    case "rate_limit_error":
      return `The server is overloaded and turned this request away; try again in a few seconds. (${detail})`;
    case "authentication_error":
      return `The API key was not accepted; set it in Settings. (${detail})`;
    case "service_unavailable":
      return `The server cannot take requests right now. (${detail})`;
    case "connection_error":
      return detail;
    default:
      return detail;
  }
}
