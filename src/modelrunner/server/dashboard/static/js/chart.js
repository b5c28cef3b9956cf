// Line charts in SVG, drawn at the container's width: a few series of (time, value) over a fixed window.

import { h, svg } from "./dom.js";

const HEIGHT = 150;
const PAD = { left: 48, right: 10, top: 10, bottom: 20 };
const MIN_SPAN = 60; // seconds

export class LineChart {
  constructor(id, title, format, windowSeconds) {
    this.format = format;
    this.windowSeconds = windowSeconds;
    this.value = h("span", { class: "chart-value" });
    this.legend = h("div", { class: "legend" });
    this.plot = h("div", { class: "plot" });
    this.note = h("p", { class: "chart-note muted small" });
    this.element = h(
      "section",
      { class: "card chart", dataset: { chart: id } },
      h("header", {}, h("h3", { text: title }), this.value),
      this.plot,
      this.note,
      this.legend,
    );
  }

  // series: [{name, cls, points: [[t, v], ...], limit?}] with t in seconds (Date.now()/1000). The time axis
  // starts at `since` (when the data starts; else at the first point), at least a minute and at most the
  // window before now: the charts of a page just opened are not squeezed against its right edge.
  draw(series, note = "", since = null) {
    const width = Math.max(260, this.plot.clientWidth || 600);
    const now = Date.now() / 1000;
    let earliest = since ?? now;
    for (const s of series) if (since === null && s.points.length) earliest = Math.min(earliest, s.points[0][0]);
    const span = Math.min(this.windowSeconds, Math.max(MIN_SPAN, now - earliest));
    const start = now - span;
    let peak = 0;
    for (const s of series) for (const [t, v] of s.points) if (t >= start && v > peak) peak = v;
    this.element.dataset.peak = String(peak); // the highest value shown (read by the browser tests)
    const max = niceMax(peak);
    const x = (t) => PAD.left + ((t - start) / span) * (width - PAD.left - PAD.right);
    const y = (v) => HEIGHT - PAD.bottom - (v / max) * (HEIGHT - PAD.top - PAD.bottom);
    const chart = svg("svg", { viewBox: `0 0 ${width} ${HEIGHT}`, width, height: HEIGHT, role: "img" });
    for (const fraction of [0, 0.5, 1]) {
      const level = max * fraction;
      chart.append(
        svg("line", { x1: PAD.left, x2: width - PAD.right, y1: y(level), y2: y(level), class: "grid" }),
        svg("text", { x: PAD.left - 6, y: y(level) + 4, class: "axis end", text: this.format(level) }),
      );
    }
    chart.append(
      svg("text", { x: PAD.left, y: HEIGHT - 4, class: "axis", text: `-${Math.round(span / 60)} min` }),
      svg("text", { x: width - PAD.right, y: HEIGHT - 4, class: "axis end", text: "now" }),
    );
    for (const s of series) {
      const points = s.points.filter(([t]) => t >= start);
      if (points.length === 1) {
        chart.append(svg("circle", { cx: x(points[0][0]), cy: y(points[0][1]), r: 3, class: `dot ${s.cls}` }));
      } else if (points.length) {
        const path = points.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("");
        chart.append(svg("path", { d: path, class: `line ${s.cls}` }));
      }
    }
    this.note.textContent = note;
    this.plot.replaceChildren(chart);
    this.legend.replaceChildren(
      ...series.map((s) => {
        const last = s.points.length ? s.points[s.points.length - 1][1] : null;
        return h("span", { class: `key ${s.cls}` }, h("i"), `${s.name}: ${last === null ? "—" : this.format(last)}`);
      }),
    );
    const first = series[0];
    const current = first && first.points.length ? first.points[first.points.length - 1][1] : null;
    this.value.textContent = current === null ? "" : this.format(current);
  }
}

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}
