// The chat page: conversations (kept in localStorage), the composer, and replies streamed
// over the page's WebSocket and rendered as they arrive.

import { apiFetch, describeError } from "./api.js";
import { Connection } from "./connection.js";
import { copyText, renderMarkdown } from "./markdown.js";
import { messageStats } from "./message_stats.js";
import { bindSettings, requestParams } from "./settings.js";
import * as store from "./store.js";
import { initThemeToggle } from "./theme.js";

const $ = (selector) => document.querySelector(selector);
// Re-rendering markdown on every token frame is cheap, but frames can come faster than the
// screen refreshes; render at most this often while streaming.
const RENDER_INTERVAL_MS = 30;

const ui = {
  list: $("#conversation-list"),
  messages: $("#messages"),
  form: $("#composer"),
  prompt: $("#prompt"),
  send: $("#send"),
  stop: $("#stop"),
  status: $("#connection-status"),
  banner: $("#banner"),
  bannerText: $("#banner-text"),
  bannerAction: $("#banner-action"),
  modelName: $("#model-name"),
  announcer: $("#announcer"),
  sidebar: $("#sidebar"),
  settings: $("#settings"),
  apiKey: $("#api-key"),
};

const settings = bindSettings(onApiKeyChange);
const connection = new Connection(store.loadApiKey);
let conversation = store.listConversations()[0] ?? store.newConversation();
let active = null; // the reply being generated: {id, owner, message}
const bubbles = new Map(); // message id -> its <article>, for the conversation on screen

function messageId() {
  return `m-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 7)}`;
}

// ---- conversations -------------------------------------------------------------------------

function save() {
  conversation.updated = Date.now();
  if (!store.saveConversation(conversation)) {
    showBanner("This browser's storage is full: the conversation will not be kept.", null);
  }
  renderConversationList();
}

function renderConversationList() {
  const conversations = store.listConversations();
  if (!conversations.some((c) => c.id === conversation.id)) conversations.unshift(conversation);
  ui.list.replaceChildren(
    ...conversations.map((c) => {
      const item = document.createElement("li");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "conversation-open";
      open.textContent = c.title;
      if (c.id === conversation.id) open.setAttribute("aria-current", "true");
      open.addEventListener("click", () => switchTo(c.id));
      const remove = document.createElement("button");
      remove.type = "button";
      remove.className = "conversation-delete icon-button";
      remove.textContent = "×";
      remove.setAttribute("aria-label", `Delete “${c.title}”`);
      remove.addEventListener("click", () => removeConversation(c.id));
      item.append(open, remove);
      return item;
    }),
  );
}

function switchTo(id) {
  if (id !== conversation.id) {
    // The conversation being answered is the live object, not its stored snapshot.
    conversation =
      active?.owner.id === id ? active.owner : (store.loadConversation(id) ?? store.newConversation());
    renderConversation();
    renderConversationList();
  }
  closeDrawers();
  ui.prompt.focus();
}

function startNewChat() {
  conversation = store.newConversation();
  renderConversation();
  renderConversationList();
  closeDrawers();
  ui.prompt.focus();
}

function removeConversation(id) {
  if (active?.owner.id === id) stop();
  store.deleteConversation(id);
  if (id === conversation.id) {
    conversation = store.listConversations()[0] ?? store.newConversation();
    renderConversation();
  }
  renderConversationList();
}

// ---- messages ------------------------------------------------------------------------------

function renderConversation() {
  bubbles.clear();
  const last = lastAssistant();
  ui.messages.replaceChildren(
    ...conversation.messages.map((message) => messageElement(message, message === last)),
  );
  if (!conversation.messages.length) ui.messages.append(emptyState());
  scrollToEnd(true);
  updateComposer();
}

function emptyState() {
  const empty = document.createElement("p");
  empty.className = "empty-state";
  empty.textContent = "Ask something. Enter sends, Shift+Enter starts a new line, Esc stops a reply.";
  return empty;
}

function lastAssistant() {
  const messages = conversation.messages;
  const last = messages[messages.length - 1];
  return last?.role === "assistant" ? last : null;
}

function messageElement(message, isLast) {
  const article = document.createElement("article");
  article.className = `message ${message.role}`;
  article.dataset.messageId = message.id;
  const role = document.createElement("h2");
  role.className = "message-role";
  role.textContent = message.role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "message-content";
  const meta = document.createElement("div");
  meta.className = "message-meta";
  const actions = document.createElement("div");
  actions.className = "message-actions";
  article.append(role, content, meta, actions);
  fillMessage(article, message, isLast);
  bubbles.set(message.id, article);
  return article;
}

/** (Re)draw a message's content, stats and buttons from its record. */
function fillMessage(article, message, isLast) {
  const [, content, meta, actions] = article.children;
  // A reply saved mid-stream by a tab that was then closed will never finish.
  const interrupted = message.state === "streaming" && active?.message !== message;
  const state = interrupted ? "error" : (message.state ?? "done");
  const errorText = interrupted ? "The reply was interrupted before it finished." : message.error;
  article.dataset.state = state;
  if (message.finish) article.dataset.finish = message.finish;
  if (message.role === "assistant") {
    content.replaceChildren(renderMarkdown(message.content));
  } else {
    content.textContent = message.content;
  }
  meta.replaceChildren();
  if (state === "streaming" && !message.content) {
    const waiting = document.createElement("span");
    waiting.className = "typing";
    waiting.textContent = "Waiting for the first token…";
    meta.append(waiting);
  }
  if (message.timing || message.usage) meta.append(messageStats(message));
  if (message.leftOut) {
    const note = document.createElement("span");
    note.className = "context-note";
    const plural = message.leftOut === 1 ? "message" : "messages";
    note.textContent = `${message.leftOut} earlier ${plural} left out to fit the model's context`;
    meta.append(note);
  }
  if (message.finish === "cancelled" || message.finish === "length") {
    const badge = document.createElement("span");
    badge.className = `finish-badge finish-${message.finish}`;
    badge.textContent = message.finish === "cancelled" ? "Stopped" : "Hit the token limit";
    meta.append(badge);
  }
  if (errorText) {
    // Not an alert itself: the announcer reads out errors as they happen, not on every redraw.
    const error = document.createElement("p");
    error.className = "message-error";
    error.textContent = errorText;
    meta.append(error);
  }
  actions.replaceChildren();
  if (state === "streaming") return;
  if (message.content) actions.append(actionButton("Copy", (b) => copyText(message.content, b)));
  if (isLast && message.role === "assistant") {
    actions.append(actionButton("Regenerate", () => regenerate()));
  }
}

function actionButton(label, onClick) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "action";
  button.textContent = label;
  button.addEventListener("click", () => onClick(button));
  return button;
}

function appendMessage(message) {
  ui.messages.querySelector(".empty-state")?.remove();
  // The previous last reply loses its Regenerate button.
  const previous = lastAssistant();
  conversation.messages.push(message);
  if (previous) refresh(previous);
  ui.messages.append(messageElement(message, message === lastAssistant()));
  scrollToEnd(true);
}

function refresh(message) {
  const article = bubbles.get(message.id);
  if (article) fillMessage(article, message, message === lastAssistant());
}

function scrollToEnd(force) {
  const box = ui.messages;
  const nearEnd = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  if (force || nearEnd) box.scrollTop = box.scrollHeight;
}

// ---- generation ----------------------------------------------------------------------------

function send(text) {
  if (active || !text.trim()) return;
  if (conversation.title === "New chat") conversation.title = text.trim().slice(0, 48);
  appendMessage({ id: messageId(), role: "user", content: text });
  ui.prompt.value = "";
  autosize();
  generateReply();
}

function regenerate() {
  if (active) return;
  const last = lastAssistant();
  if (last) {
    conversation.messages.pop();
    bubbles.get(last.id)?.remove();
  }
  generateReply();
}

/** The conversation as sent: the system prompt, then the turns from `start` on (earlier ones
 * were left out to fit the model's context). */
function chatHistory(owner, start) {
  const history = [];
  const system = settings.current.systemPrompt.trim();
  if (system) history.push({ role: "system", content: system });
  for (const message of owner.messages.slice(start)) {
    if (message.content) history.push({ role: message.role, content: message.content });
  }
  return history;
}

/** Where the next request's history starts once the server says it does not fit: one turn
 * (a message and its reply) later, or null when only the latest message would be left. */
function laterStart(owner, start) {
  const sent = owner.messages.filter((m, i) => i >= start && m.content && m.state !== "streaming");
  if (sent.length <= 1) return null;
  const dropped = Math.min(2, sent.length - 1);
  return owner.messages.indexOf(sent[dropped]);
}

async function generateReply() {
  const reply = { id: messageId(), role: "assistant", content: "", state: "streaming" };
  const owner = conversation;
  active = { id: null, owner, message: reply };
  appendMessage(reply);
  save();
  updateComposer();
  await requestReply(owner, reply);
}

async function requestReply(owner, reply) {
  // Turns left out before stay left out: the conversation only grows.
  const start = Math.min(owner.contextStart ?? 0, owner.messages.length - 1);
  const messages = chatHistory(owner, start);
  try {
    await connection.whenOpen();
  } catch (error) {
    if (active?.message === reply) finishReply(owner, reply, { error: error.message });
    return;
  }
  if (active?.message !== reply) return; // stopped while connecting
  let renderPending = false;
  const render = () => {
    renderPending = false;
    if (conversation === owner) {
      refresh(reply);
      scrollToEnd(false);
    }
  };
  active.id = connection.generate(
    { messages, ...requestParams(settings.current) },
    {
      onToken(text) {
        reply.content += text;
        if (!renderPending) {
          renderPending = true;
          setTimeout(render, RENDER_INTERVAL_MS);
        }
      },
      onDone(frame) {
        finishReply(owner, reply, {
          finish: frame.finish_reason,
          usage: frame.usage,
          timing: frame.timing,
        });
      },
      onError(error) {
        const next = error.code === "context_length_exceeded" ? laterStart(owner, start) : null;
        if (next !== null && active?.message === reply) {
          owner.contextStart = next;
          reply.leftOut = owner.messages.slice(0, next).filter((m) => m.content).length;
          requestReply(owner, reply);
          return;
        }
        finishReply(owner, reply, { error: describeError(error), errorType: error.type });
      },
    },
  );
}

function finishReply(owner, reply, outcome) {
  Object.assign(reply, outcome, { state: outcome.error ? "error" : "done" });
  if (active?.message === reply) active = null;
  if (conversation !== owner) {
    // The user switched away: keep the reply in its own conversation, unless it was deleted.
    if (store.loadConversation(owner.id)) {
      owner.updated = Date.now();
      store.saveConversation(owner);
    }
  } else {
    save();
    refresh(reply);
    scrollToEnd(false);
  }
  announce(outcome.error ? `Error: ${outcome.error}` : finishAnnouncement(outcome.finish));
  updateComposer();
}

function finishAnnouncement(finish) {
  if (finish === "cancelled") return "Reply stopped.";
  if (finish === "length") return "Reply ended at the token limit.";
  return "Reply complete.";
}

function stop() {
  if (!active) return;
  if (active.id !== null) {
    connection.cancel(active.id);
  } else {
    // Still waiting for the socket: nothing was sent, so end it here.
    finishReply(active.owner, active.message, { finish: "cancelled" });
  }
}

// ---- composer, status, banner --------------------------------------------------------------

function updateComposer() {
  const busy = active !== null;
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
}

function autosize() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight, 240)}px`;
}

function announce(text) {
  ui.announcer.textContent = "";
  // A change the screen reader notices even when the same words repeat.
  setTimeout(() => {
    ui.announcer.textContent = text;
  }, 50);
}

function showBanner(text, action) {
  ui.bannerText.textContent = text;
  ui.bannerAction.hidden = !action;
  if (action) {
    ui.bannerAction.textContent = action.label;
    ui.bannerAction.onclick = action.run;
  }
  ui.banner.hidden = false;
}

function hideBanner() {
  ui.banner.hidden = true;
}

let countdown = null;

function onConnectionStatus(event) {
  const { state, message, retryInMs } = event.detail;
  clearInterval(countdown);
  ui.status.dataset.state = state;
  if (state === "open") {
    ui.status.textContent = "Connected";
    hideBanner();
    loadModel();
  } else if (state === "connecting") {
    ui.status.textContent = "Connecting…";
  } else if (state === "retrying") {
    ui.status.textContent = "Offline";
    const until = Date.now() + retryInMs;
    const tick = () => {
      const seconds = Math.max(0, Math.ceil((until - Date.now()) / 1000));
      showBanner(`${message} Reconnecting in ${seconds} s…`, {
        label: "Retry now",
        run: () => connection.reconnectNow(),
      });
    };
    tick();
    countdown = setInterval(tick, 1000);
  } else {
    ui.status.textContent = "Needs API key";
    showBanner(message, { label: "Set API key", run: () => openSettings(ui.apiKey) });
  }
}

async function loadModel() {
  try {
    const response = await apiFetch("/v1/models", store.loadApiKey());
    if (!response.ok) return;
    const card = (await response.json()).data?.[0];
    if (card?.id) {
      ui.modelName.textContent = card.id;
      document.title = `${card.id} · Baton`;
    }
    if (Number.isInteger(card?.max_model_len)) {
      document.getElementById("max-tokens").max = String(card.max_model_len);
    }
  } catch {
    // The socket's own status already says the server is unreachable.
  }
}

function onApiKeyChange() {
  connection.reconnectNow();
}

// ---- drawers (conversations and settings on small screens) ---------------------------------

function openSettings(focusTarget) {
  ui.settings.hidden = false;
  $("#toggle-settings").setAttribute("aria-expanded", "true");
  (focusTarget ?? ui.settings.querySelector("textarea, input, select"))?.focus();
}

function toggleSettings() {
  if (ui.settings.hidden) openSettings();
  else closeSettings();
}

function closeSettings() {
  const hadFocus = ui.settings.contains(document.activeElement);
  ui.settings.hidden = true;
  $("#toggle-settings").setAttribute("aria-expanded", "false");
  if (hadFocus) $("#toggle-settings").focus();
}

function toggleSidebar() {
  const open = ui.sidebar.classList.toggle("open");
  $("#toggle-sidebar").setAttribute("aria-expanded", String(open));
}

function closeDrawers() {
  ui.sidebar.classList.remove("open");
  $("#toggle-sidebar").setAttribute("aria-expanded", "false");
}

// ---- wiring --------------------------------------------------------------------------------

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  send(ui.prompt.value);
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send(ui.prompt.value);
  }
});
ui.prompt.addEventListener("input", autosize);
ui.stop.addEventListener("click", () => {
  stop();
  ui.prompt.focus();
});
document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape") return;
  if (active) stop();
  else if (!ui.settings.hidden) closeSettings();
  else closeDrawers();
});
$("#new-chat").addEventListener("click", startNewChat);
$("#toggle-settings").addEventListener("click", toggleSettings);
$("#close-settings").addEventListener("click", closeSettings);
$("#toggle-sidebar").addEventListener("click", toggleSidebar);
window.addEventListener("storage", (event) => {
  // Another tab changed the conversations: show its changes, unless we are streaming here.
  if (!store.isConversationKey(event.key)) return;
  if (!active) {
    const fresh = store.loadConversation(conversation.id);
    if (fresh && fresh.updated > conversation.updated) {
      conversation = fresh;
      renderConversation();
    }
  }
  renderConversationList();
});
connection.addEventListener("status", onConnectionStatus);

initThemeToggle($("#theme-toggle"));
renderConversation();
renderConversationList();
connection.open();
loadModel();
ui.prompt.focus();
