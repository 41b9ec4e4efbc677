// Loaded as a classic script in <head>: sets the theme before the first paint, so a dark-theme
// user never sees a white flash. `data-theme` is always set (the stylesheet has one dark palette,
// keyed on it): the remembered choice, else the system's, followed while nothing is remembered.
(() => {
  const systemDark = window.matchMedia("(prefers-color-scheme: dark)");
  const remembered = () => {
    try {
      const theme = localStorage.getItem("baton.theme");
      return theme === "light" || theme === "dark" ? theme : null;
    } catch {
      return null; // Storage disabled: follow the system.
    }
  };
  const apply = () => {
    document.documentElement.dataset.theme =
      remembered() ?? (systemDark.matches ? "dark" : "light");
  };
  apply();
  // Registered before any other listener on this query, so pages redraw on the updated theme.
  systemDark.addEventListener("change", apply);
})();
