// Conversations and settings kept in localStorage. Each conversation has its own key, so two
// tabs writing different conversations never overwrite each other.

const CONVERSATION_PREFIX = "baton.conversation.";
const SETTINGS_KEY = "baton.settings";
const API_KEY = "baton.apiKey";

export const DEFAULT_SETTINGS = {
  systemPrompt: "",
  temperature: 0.7,
  top_p: 0.95,
  top_k: 40,
  max_tokens: 256,
  sloClass: "interactive",
  ignoreEos: false,
};

function read(key, fallback) {
  try {
    const value = localStorage.getItem(key);
    return value === null ? fallback : JSON.parse(value);
  } catch {
    return fallback;
  }
}

/** Write `value`; false when storage is full or disabled. */
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(SETTINGS_KEY, {}) };
}

export function saveSettings(settings) {
  return write(SETTINGS_KEY, settings);
}

export function loadApiKey() {
  return localStorage.getItem(API_KEY) ?? "";
}

export function saveApiKey(key) {
  if (key) localStorage.setItem(API_KEY, key);
  else localStorage.removeItem(API_KEY);
}

export function newConversation() {
  const now = Date.now();
  return {
    id: `${now.toString(36)}-${Math.random().toString(36).slice(2, 8)}`,
    title: "New chat",
    created: now,
    updated: now,
    messages: [], // {id, role, content, finish?, error?, usage?, timing?}
  };
}

/** Every stored conversation, most recently updated first. */
export function listConversations() {
  const conversations = [];
  for (let i = 0; i < localStorage.length; i++) {
    const key = localStorage.key(i);
    if (key?.startsWith(CONVERSATION_PREFIX)) {
      const conversation = read(key, null);
      if (conversation?.id && Array.isArray(conversation.messages)) {
        conversations.push(conversation);
      }
    }
  }
  return conversations.sort((a, b) => b.updated - a.updated);
}

export function loadConversation(id) {
  return read(CONVERSATION_PREFIX + id, null);
}

export function saveConversation(conversation) {
  return write(CONVERSATION_PREFIX + conversation.id, conversation);
}

export function deleteConversation(id) {
  localStorage.removeItem(CONVERSATION_PREFIX + id);
}

export function isConversationKey(key) {
  return key === null || key.startsWith(CONVERSATION_PREFIX);
}
