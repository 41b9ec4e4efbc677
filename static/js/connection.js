// The page's one WebSocket to /v1/ws: many generate requests share it, told apart by id.
// It reconnects with backoff when the server goes away (a restart, a dropped network) and,
// when a connection is refused, asks /v1/models why (wrong API key, or nothing listening), so
// the page can say something more useful than "connection failed".

import { apiFetch, keyProtocols } from "./api.js";

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000];

/** Status events: {state: "connecting"|"open"|"retrying"|"unauthorized"|"bad-key",
 * retryInMs?, message?}. */
export class Connection extends EventTarget {
  constructor(getKey) {
    super();
    this.getKey = getKey;
    this.socket = null;
    this.state = "connecting";
    this.attempt = 0;
    this.retryTimer = null;
    this.requests = new Map(); // id -> {onToken, onDone, onError}
    this.nextId = 1;
    this.idPrefix = Math.random().toString(36).slice(2, 8);
    // Back on the network: skip the rest of the backoff wait.
    window.addEventListener("online", () => {
      if (this.state === "retrying") this.reconnectNow();
    });
  }

  /** Open the socket (again), dropping any wait for a retry. */
  reconnectNow() {
    clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) {
      this.socket.onclose = null;
      this.socket.close();
      this.failAll("The connection was reopened; the reply was cut short.");
    }
    this.open();
  }

  open() {
    const url = new URL("/v1/ws", window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    let socket;
    try {
      socket = new WebSocket(url, keyProtocols(this.getKey()));
    } catch {
      // The browser refuses subprotocols with characters outside RFC 7230 tokens.
      this.setState("bad-key", {
        message: "The API key has characters that cannot be sent from a browser.",
      });
      return;
    }
    this.socket = socket;
    let opened = false;
    this.setState("connecting");
    socket.onopen = () => {
      opened = true;
      this.attempt = 0;
      this.setState("open");
    };
    socket.onmessage = (event) => this.receive(event.data);
    socket.onclose = () => {
      if (this.socket !== socket) return;
      this.socket = null;
      this.setState("connecting");
      this.failAll(
        opened
          ? "The connection to the server was lost before the reply finished."
          : "Could not reach the server.",
      );
      this.diagnose();
    };
  }

  async diagnose() {
    // A refused upgrade tells the page nothing; the same key on a plain request does.
    let status = null;
    try {
      status = (await apiFetch("/v1/models", this.getKey())).status;
    } catch {
      status = null;
    }
    if (status === 401) {
      this.setState("unauthorized", {
        message: "The server did not accept the API key. Set the key in Settings.",
      });
      return;
    }
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt++;
    // Jitter, so tabs reconnecting to a restarted server do not all arrive at once.
    const retryInMs = Math.round(delay * (0.8 + Math.random() * 0.4));
    const message =
      status === null
        ? "The server is unreachable."
        : `The server refused the connection (HTTP ${status}).`;
    this.setState("retrying", { retryInMs, message });
    this.retryTimer = setTimeout(() => this.open(), retryInMs);
  }

  setState(state, detail = {}) {
    this.state = state;
    this.dispatchEvent(new CustomEvent("status", { detail: { state, ...detail } }));
  }

  /** Resolve once the socket is open; reject after `timeoutMs` or when the key is refused. */
  whenOpen(timeoutMs = 5000) {
    if (this.state === "open") return Promise.resolve();
    if (this.state === "retrying") this.reconnectNow();
    return new Promise((resolve, reject) => {
      const done = (error) => {
        clearTimeout(timer);
        this.removeEventListener("status", onStatus);
        error ? reject(error) : resolve();
      };
      const onStatus = (event) => {
        const { state, message } = event.detail;
        if (state === "open") done();
        else if (state === "unauthorized" || state === "bad-key") done(new Error(message));
      };
      const timer = setTimeout(
        () => done(new Error("Could not connect to the server; it may be down or restarting.")),
        timeoutMs,
      );
      this.addEventListener("status", onStatus);
      if (this.state === "unauthorized" || this.state === "bad-key") this.reconnectNow();
    });
  }

  /** Send a generate frame; returns its id. `handlers`: onToken(text), onDone(frame),
   * onError({message, type, code}). */
  generate(params, handlers) {
    const id = `${this.idPrefix}-${this.nextId++}`;
    if (this.socket?.readyState !== WebSocket.OPEN) {
      const message = "The connection to the server was lost; try again in a moment.";
      queueMicrotask(() => handlers.onError({ message, type: "connection_error" }));
      return id;
    }
    this.requests.set(id, handlers);
    this.socket.send(JSON.stringify({ type: "generate", id, ...params }));
    return id;
  }

  cancel(id) {
    if (this.requests.has(id) && this.socket?.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: "cancel", id }));
    }
  }

  receive(data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    const handlers = this.requests.get(frame.id);
    if (!handlers) {
      if (frame.type === "error") console.warn("Baton:", frame.error?.message);
      return;
    }
    if (frame.type === "token") {
      handlers.onToken(frame.text);
    } else if (frame.type === "done") {
      this.requests.delete(frame.id);
      handlers.onDone(frame);
    } else if (frame.type === "error") {
      this.requests.delete(frame.id);
      handlers.onError(frame.error ?? { message: "The server reported an error." });
    }
  }

  failAll(message) {
    const pending = [...this.requests.values()];
    this.requests.clear();
    for (const handlers of pending) handlers.onError({ message, type: "connection_error" });
  }
}
