// Metrics: live charts of /metrics (Prometheus text) over the last minutes. Samples are taken every 2 s
// while the page is open and kept for this tab; rates come from counters' differences between samples.

import { request } from "../api.js";
import { bytes, h, notice, seconds } from "../dom.js";
import { LineChart } from "../chart.js";

const WINDOW = 10 * 60; // seconds shown
const PERIOD = 2000;
const samples = []; // {t, metrics: Map(name -> [{labels, value}]), text}

export function parseMetrics(text) {
  const metrics = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const value = Number(match[4]);
    if (!Number.isFinite(value)) continue;
    if (!metrics.has(match[1])) metrics.set(match[1], []);
    metrics.get(match[1]).push({ labels: match[3] || "", value });
  }
  return metrics;
}

// Sum of every series whose name matches (exactly, or by suffix for names like `vllm:…`).
function total(metrics, names) {
  let sum = 0;
  let found = false;
  for (const [name, series] of metrics) {
    if (names.some((n) => (n.startsWith("*") ? name.endsWith(n.slice(1)) : name === n))) {
      for (const s of series) sum += s.value;
      found = true;
    }
  }
  return found ? sum : null;
}

// Rate of a counter between two samples; a reset (a runner reloaded) counts from zero.
function rate(a, b, names) {
  const before = total(a.metrics, names);
  const after = total(b.metrics, names);
  if (after === null) return null;
  const delta = after - (before ?? 0) < 0 ? after : after - (before ?? 0);
  return delta / (b.t - a.t);
}

// The daemon's own metrics (server/request_metrics.py), whichever engine answers; the engines' queues too.
const TOKENS = ["modelrunner_generated_tokens_total"];
const TTFT_SUM = ["modelrunner_time_to_first_token_seconds_sum"];
const TTFT_COUNT = ["modelrunner_time_to_first_token_seconds_count"];
const WAITING = ["modelrunner_queue_depth"];
const RUNNING = ["modelrunner_requests_running"];
const ENGINE_QUEUE = ["llamacpp:requests_deferred", "vllm:num_requests_waiting"];
const MEMORY = ["modelrunner_memory_in_use_bytes"];
const BUDGET = ["modelrunner_memory_budget_bytes"];

async function sample() {
  const text = await request("/metrics").then((r) => r.text());
  samples.push({ t: Date.now() / 1000, metrics: parseMetrics(text), text });
  while (samples.length && samples[0].t < Date.now() / 1000 - WINDOW - 10) samples.shift();
}

function series() {
  const tokens = [];
  const ttft = [];
  const queue = [];
  const engineQueue = [];
  const running = [];
  const memory = [];
  let budget = null;
  let streamed = 0;
  for (let i = 0; i < samples.length; i += 1) {
    const s = samples[i];
    queue.push([s.t, total(s.metrics, WAITING) ?? 0]);
    engineQueue.push([s.t, total(s.metrics, ENGINE_QUEUE) ?? 0]);
    running.push([s.t, total(s.metrics, RUNNING) ?? 0]);
    memory.push([s.t, total(s.metrics, MEMORY) ?? 0]);
    budget = total(s.metrics, BUDGET) ?? budget;
    streamed = total(s.metrics, TTFT_COUNT) ?? streamed;
    if (i === 0) continue;
    const previous = samples[i - 1];
    tokens.push([s.t, rate(previous, s, TOKENS) ?? 0]);
    const count = (total(s.metrics, TTFT_COUNT) ?? 0) - (total(previous.metrics, TTFT_COUNT) ?? 0);
    const sum = (total(s.metrics, TTFT_SUM) ?? 0) - (total(previous.metrics, TTFT_SUM) ?? 0);
    if (count > 0 && sum >= 0) ttft.push([s.t, sum / count]);
  }
  return { tokens, ttft, queue, engineQueue, running, memory, budget, streamed };
}

export default {
  id: "metrics",
  title: "Metrics",
  mount(root) {
    const charts = {
      tokens: new LineChart("tokens", "Tokens per second (generated)", (v) => v.toFixed(v < 10 ? 1 : 0), WINDOW),
      ttft: new LineChart("ttft", "Time to first token (streamed answers)", (v) => seconds(v), WINDOW),
      queue: new LineChart("queue", "Requests waiting and running", (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1)), WINDOW),
      memory: new LineChart("memory", "Memory in use (estimated)", (v) => bytes(v), WINDOW),
    };
    const status = h("div", { class: "messages" });
    const raw = h("pre", { class: "body raw-metrics" });
    root.append(
      h("div", { class: "page-head" }, h("h1", { text: "Metrics" }), h("span", { class: "muted", text: "every 2 s, last 10 minutes" })),
      status,
      h("div", { class: "charts", id: "charts" }, Object.values(charts).map((c) => c.element)),
      h("details", { class: "card" }, h("summary", { text: "Raw /metrics" }), raw),
    );
    const draw = () => {
      const s = series();
      const since = samples.length ? samples[0].t : null;
      const collecting = samples.length < 2 ? "collecting…" : "";
      charts.tokens.draw([{ name: "generated", cls: "c1", points: s.tokens }], collecting, since);
      const ttftNote = s.ttft.length ? "" : s.streamed ? "no streamed answer in the last 10 minutes" : "no streamed answer yet";
      charts.ttft.draw([{ name: "mean of the answers in each interval", cls: "c2", points: s.ttft }], collecting || ttftNote, since);
      const queue = [
        { name: "waiting for a runner", cls: "c3", points: s.queue },
        { name: "being answered", cls: "c1", points: s.running },
        { name: "waiting in engines", cls: "c4", points: s.engineQueue },
      ];
      charts.queue.draw(queue, "", since);
      const budget = s.budget === null ? "" : ` (budget ${bytes(s.budget)})`;
      charts.memory.draw([{ name: `runners${budget}`, cls: "c2", points: s.memory }], "", since);
      const last = samples[samples.length - 1];
      if (last) raw.textContent = last.text;
    };
    let alive = true;
    const tick = async () => {
      if (document.visibilityState === "visible") {
        try {
          await sample();
          status.replaceChildren();
        } catch (error) {
          status.replaceChildren(notice("error", error.message));
        }
      }
      if (alive) draw();
    };
    tick();
    const timer = setInterval(tick, PERIOD);
    const resize = () => draw();
    window.addEventListener("resize", resize);
    return () => {
      alive = false;
      clearInterval(timer);
      window.removeEventListener("resize", resize);
    };
  },
};
