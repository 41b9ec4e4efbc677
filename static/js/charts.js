// Small line charts drawn on a canvas: the last `windowS` seconds of samples per series on a
// time axis, gaps where a value is null, colours from the page's CSS custom properties so the
// theme applies.

const GRID_LINES = 3;
// Seconds between time-axis ticks.
const TICK_S = 30;

export class LineChart {
  /** `series`: [{label, color: "--chart-1"}]; `windowS`: seconds shown; `max`: a fixed top
   * (fractions) or null to fit; `format(value)`: how the top gridline's value reads. */
  constructor(canvas, { series, windowS = 120, max = null, format = String }) {
    this.canvas = canvas;
    this.series = series;
    this.windowS = windowS;
    this.max = max;
    this.format = format;
    // Per series, [{t, value}] with t in seconds, oldest first.
    this.samples = series.map(() => []);
    this.now = Date.now() / 1000;
    new ResizeObserver(() => this.draw()).observe(canvas);
    document.addEventListener("themechange", () => this.draw());
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => this.draw());
  }

  /** One sample per series, taken at `t` (seconds; now by default). */
  push(values, t = Date.now() / 1000) {
    this.now = t;
    values.forEach((value, i) => {
      const samples = this.samples[i];
      samples.push({ t, value: typeof value === "number" && Number.isFinite(value) ? value : null });
      while (samples.length && samples[0].t < t - this.windowS) samples.shift();
    });
    this.draw();
  }

  top() {
    if (this.max !== null) return this.max;
    const values = this.samples.flat().map((s) => s.value).filter((v) => v !== null);
    return niceCeiling(Math.max(0, ...values));
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
    const pad = { left: 4, right: 4, top: 14, bottom: 18 };
    const plotHeight = height - pad.top - pad.bottom;
    const plotWidth = width - pad.left - pad.right;
    const xAt = (t) => pad.left + plotWidth * (1 - (this.now - t) / this.windowS);
    const yAt = (value) => pad.top + plotHeight * (1 - Math.min(value, top) / top);

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
    this.drawTimeAxis(context, pad, height, xAt);

    this.series.forEach((series, i) => {
      const samples = this.samples[i];
      context.strokeStyle = style.getPropertyValue(series.color);
      context.lineWidth = 2;
      context.lineJoin = "round";
      context.beginPath();
      let drawing = false;
      for (const { t, value } of samples) {
        if (value === null) {
          drawing = false;
          continue;
        }
        if (drawing) context.lineTo(xAt(t), yAt(value));
        else context.moveTo(xAt(t), yAt(value));
        drawing = true;
      }
      context.stroke();
      // A dot on the newest value, so a lone sample between gaps still shows.
      const last = samples.at(-1);
      if (last && last.value !== null) {
        context.fillStyle = context.strokeStyle;
        context.beginPath();
        context.arc(xAt(last.t), yAt(last.value), 2.5, 0, 2 * Math.PI);
        context.fill();
      }
    });
    canvas.setAttribute("aria-label", this.describe());
  }

  /** A tick and a label every TICK_S seconds back from now, along the bottom. */
  drawTimeAxis(context, pad, height, xAt) {
    const baseline = height - pad.bottom + 0.5;
    context.textBaseline = "top";
    for (let ago = 0; ago <= this.windowS; ago += TICK_S) {
      const x = Math.round(xAt(this.now - ago)) + 0.5;
      context.beginPath();
      context.moveTo(x, baseline);
      context.lineTo(x, baseline + 3);
      context.stroke();
      context.textAlign = ago === 0 ? "right" : ago === this.windowS ? "left" : "center";
      context.fillText(timeAgo(ago), ago === 0 ? x + 0.5 : x, baseline + 4);
    }
    context.textAlign = "left";
    context.textBaseline = "alphabetic";
  }

  describe() {
    const latest = this.series.map((series, i) => {
      const value = this.samples[i].at(-1)?.value;
      return `${series.label} ${value === null || value === undefined ? "no data" : this.format(value)}`;
    });
    return `Chart of the last ${this.windowS} seconds; latest: ${latest.join(", ")}`;
  }
}

/** How long ago `seconds` was, as a time-axis label: "now", "-30 s", "-2 min". */
export function timeAgo(seconds) {
  if (seconds === 0) return "now";
  return seconds % 60 === 0 ? `-${seconds / 60} min` : `-${seconds} s`;
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
