// Small line charts drawn on a canvas: a rolling window of samples per series, gaps where a
// value is null, colours from the page's CSS custom properties so the theme applies.

const GRID_LINES = 3;

export class LineChart {
  /** `series`: [{label, color: "--chart-1"}]; `max`: a fixed top (fractions) or null to fit;
   * `format(value)`: how the top gridline's value reads. */
  constructor(canvas, { series, capacity = 120, max = null, format = String }) {
    this.canvas = canvas;
    this.series = series;
    this.capacity = capacity;
    this.max = max;
    this.format = format;
    this.samples = series.map(() => []);
    new ResizeObserver(() => this.draw()).observe(canvas);
    document.addEventListener("themechange", () => this.draw());
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.draw());
  }

  push(values) {
    values.forEach((value, i) => {
      const samples = this.samples[i];
      samples.push(typeof value === "number" && Number.isFinite(value) ? value : null);
      if (samples.length > this.capacity) samples.shift();
    });
    this.draw();
  }

  top() {
    if (this.max !== null) return this.max;
    const highest = Math.max(0, ...this.samples.flat().filter((v) => v !== null));
    return niceCeiling(highest);
  }

  draw() {
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    const style = getComputedStyle(canvas);
    const top = this.top();
    const pad = { left: 4, right: 4, top: 14, bottom: 4 };
    const plotHeight = height - pad.top - pad.bottom;
    const plotWidth = width - pad.left - pad.right;

    context.strokeStyle = style.getPropertyValue("--chart-grid");
    context.fillStyle = style.getPropertyValue("--muted");
    context.font = `11px ${style.getPropertyValue("--font")}`;
    context.lineWidth = 1;
    for (let line = 0; line <= GRID_LINES; line++) {
      const y = pad.top + (plotHeight * line) / GRID_LINES + 0.5;
      context.beginPath();
      context.moveTo(pad.left, y);
      context.lineTo(width - pad.right, y);
      context.stroke();
    }
    context.fillText(this.format(top), pad.left + 2, pad.top - 3);

    const step = plotWidth / Math.max(1, this.capacity - 1);
    this.series.forEach((series, i) => {
      const samples = this.samples[i];
      // The newest sample sits at the right edge; older ones scroll left.
      const offset = this.capacity - samples.length;
      context.strokeStyle = style.getPropertyValue(series.color);
      context.lineWidth = 2;
      context.lineJoin = "round";
      context.beginPath();
      let drawing = false;
      samples.forEach((value, index) => {
        if (value === null) {
          drawing = false;
          return;
        }
        const x = pad.left + (offset + index) * step;
        const y = pad.top + plotHeight * (1 - Math.min(value, top) / top);
        if (drawing) context.lineTo(x, y);
        else context.moveTo(x, y);
        drawing = true;
      });
      context.stroke();
      // A dot on the newest value, so a lone sample between gaps still shows.
      const last = samples.at(-1);
      if (last !== null && last !== undefined) {
        context.fillStyle = context.strokeStyle;
        context.beginPath();
        const y = pad.top + plotHeight * (1 - Math.min(last, top) / top);
        context.arc(width - pad.right, y, 2.5, 0, 2 * Math.PI);
        context.fill();
      }
    });
    canvas.setAttribute("aria-label", this.describe());
  }

  describe() {
    const latest = this.series.map((series, i) => {
      const value = this.samples[i].at(-1);
      return `${series.label} ${value === null || value === undefined ? "no data" : this.format(value)}`;
    });
    return `Chart of the last ${this.capacity} seconds; latest: ${latest.join(", ")}`;
  }
}

/** The smallest 1, 2 or 5 × 10^n at or above `value`; 1 for nothing above 0. */
export function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const multiple of [1, 2, 5, 10]) {
    if (value <= multiple * magnitude) return multiple * magnitude;
  }
  return 10 * magnitude;
}
