// Light and dark: the system's choice (prefers-color-scheme) until the toggle picks one, which
// is remembered. theme-boot.js applies either as `data-theme` before the page paints.

const THEME_KEY = "baton.theme";
const systemDark = window.matchMedia("(prefers-color-scheme: dark)");

function effectiveTheme() {
  return document.documentElement.dataset.theme === "dark" ? "dark" : "light";
}

/** Wire `button` to switch between light and dark. */
export function initThemeToggle(button) {
  const show = () => {
    const dark = effectiveTheme() === "dark";
    button.setAttribute("aria-pressed", String(dark));
    button.title = dark ? "Switch to the light theme" : "Switch to the dark theme";
    document.dispatchEvent(new CustomEvent("themechange"));
  };
  button.addEventListener("click", () => {
    const next = effectiveTheme() === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    localStorage.setItem(THEME_KEY, next);
    show();
  });
  systemDark.addEventListener("change", show);
  show();
}
