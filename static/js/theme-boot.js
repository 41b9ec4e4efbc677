// Loaded as a classic script in <head>: applies the remembered theme before the first paint,
// so a dark-theme user never sees a white flash.
(() => {
  try {
    const theme = localStorage.getItem("baton.theme");
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  } catch {
    // Storage disabled: follow the system.
  }
})();
