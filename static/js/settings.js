// The settings panel: system prompt, sampling parameters, the SLO class, and the API key, each
// saved in localStorage as it changes; and the request parameters they make.

import * as store from "./store.js";

// What each SLO class asks of the scheduler. `slo` targets are the server's per-request
// override (null: the server's defaults); `priority` follows the engine's convention that a
// lower number is served first.
export const SLO_CLASSES = {
  interactive: { priority: 0, slo: { ttft_ms: 1000, tpot_ms: 200 } },
  standard: { priority: 0, slo: null },
  batch: { priority: 10, slo: { ttft_ms: 60000, tpot_ms: 2000 } },
};

const NUMBER_FIELDS = {
  temperature: { id: "temperature", parse: Number.parseFloat },
  top_p: { id: "top-p", parse: Number.parseFloat },
  top_k: { id: "top-k", parse: (v) => Number.parseInt(v, 10) },
  max_tokens: { id: "max-tokens", parse: (v) => Number.parseInt(v, 10) },
};

/** The generate frame's parameters for `settings`. */
export function requestParams(settings) {
  const sloClass = SLO_CLASSES[settings.sloClass] ?? SLO_CLASSES.standard;
  const params = {
    temperature: settings.temperature,
    top_p: settings.top_p,
    top_k: settings.top_k,
    max_tokens: settings.max_tokens,
    priority: sloClass.priority,
  };
  if (sloClass.slo) params.slo = sloClass.slo;
  if (settings.ignoreEos) params.ignore_eos = true;
  return params;
}

/** Fill the panel from storage and keep storage in step; `onApiKeyChange` runs when the key
 * is saved. Returns `{current}`, always the latest settings. */
export function bindSettings(onApiKeyChange) {
  const state = { current: store.loadSettings() };
  const byId = (id) => document.getElementById(id);
  const persist = () => store.saveSettings(state.current);

  const system = byId("system-prompt");
  system.value = state.current.systemPrompt;
  system.addEventListener("input", () => {
    state.current.systemPrompt = system.value;
    persist();
  });

  for (const [name, field] of Object.entries(NUMBER_FIELDS)) {
    const input = byId(field.id);
    const range = byId(`${field.id}-range`);
    input.value = state.current[name];
    if (range) range.value = state.current[name];
    const apply = (source) => {
      const value = field.parse(source.value);
      // Out-of-range values stay on screen (the browser marks them invalid) but are not used.
      if (Number.isFinite(value) && input.checkValidity()) {
        state.current[name] = value;
        persist();
      }
    };
    input.addEventListener("input", () => {
      if (range) range.value = input.value;
      apply(input);
    });
    range?.addEventListener("input", () => {
      input.value = range.value;
      apply(range);
    });
  }

  const sloClass = byId("slo-class");
  sloClass.value = state.current.sloClass;
  sloClass.addEventListener("change", () => {
    state.current.sloClass = sloClass.value;
    persist();
  });

  const ignoreEos = byId("ignore-eos");
  ignoreEos.checked = state.current.ignoreEos;
  ignoreEos.addEventListener("change", () => {
    state.current.ignoreEos = ignoreEos.checked;
    persist();
  });

  const keyForm = byId("api-key-form");
  const key = byId("api-key");
  const keyStatus = byId("api-key-status");
  key.value = store.loadApiKey();
  keyForm.addEventListener("submit", (event) => {
    event.preventDefault();
    store.saveApiKey(key.value.trim());
    keyStatus.textContent = key.value.trim() ? "Key saved in this browser." : "Key removed.";
    onApiKeyChange();
  });

  byId("reset-settings").addEventListener("click", () => {
    state.current = { ...store.DEFAULT_SETTINGS };
    persist();
    system.value = state.current.systemPrompt;
    for (const [name, field] of Object.entries(NUMBER_FIELDS)) {
      byId(field.id).value = state.current[name];
      const range = byId(`${field.id}-range`);
      if (range) range.value = state.current[name];
    }
    sloClass.value = state.current.sloClass;
    ignoreEos.checked = state.current.ignoreEos;
  });
  return state;
}
