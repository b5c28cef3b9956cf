// Metrics: live charts of /metrics (Prometheus text) over the last minutes. Samples are taken every 2 s
// while the page is open and kept for this tab; rates come from counters' differences between samples.

import { getJSON, request } from "../api.js";
import { bytes, h, notice, seconds } from "../dom.js";
import { LineChart } from "../chart.js";

const WINDOW = 10 * 60; // seconds shown
const PERIOD = 2000;
const samples = []; // {t, metrics: Map(name -> [{labels, value}]), overview}

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

const TOKENS = ["llamacpp:tokens_predicted_total", "*:generation_tokens_total"];
const TTFT_SUM = ["*time_to_first_token_seconds_sum"];
const TTFT_COUNT = ["*time_to_first_token_seconds_count"];
const ENGINE_QUEUE = ["llamacpp:requests_deferred", "vllm:num_requests_waiting"];
const ENGINE_RUNNING = ["llamacpp:requests_processing", "vllm:num_requests_running"];

async function sample() {
  const [text, overview] = await Promise.all([
    request("/metrics").then((r) => r.text()),
    getJSON("/dashboard/api/overview"),
  ]);
  samples.push({ t: Date.now() / 1000, metrics: parseMetrics(text), overview, text });
  while (samples.length && samples[0].t < Date.now() / 1000 - WINDOW - 10) samples.shift();
}

function series() {
  const tokens = [];
  const ttft = [];
  const queue = [];
  const engineQueue = [];
  const running = [];
  const memory = [];
  let budget = 0;
  let hasTtft = false;
  for (let i = 0; i < samples.length; i += 1) {
    const s = samples[i];
    queue.push([s.t, total(s.metrics, ["modelrunner_queue_depth"]) ?? s.overview.queue_depth]);
    engineQueue.push([s.t, total(s.metrics, ENGINE_QUEUE) ?? 0]);
    running.push([s.t, total(s.metrics, ENGINE_RUNNING) ?? 0]);
    memory.push([s.t, s.overview.memory_in_use]);
    budget = s.overview.memory_budget;
    if (total(s.metrics, TTFT_COUNT) !== null) hasTtft = true;
    if (i === 0) continue;
    const previous = samples[i - 1];
    const r = rate(previous, s, TOKENS);
    tokens.push([s.t, r ?? 0]);
    const count = (total(s.metrics, TTFT_COUNT) ?? 0) - (total(previous.metrics, TTFT_COUNT) ?? 0);
    const sum = (total(s.metrics, TTFT_SUM) ?? 0) - (total(previous.metrics, TTFT_SUM) ?? 0);
    if (count > 0 && sum >= 0) ttft.push([s.t, sum / count]);
  }
  return { tokens, ttft, queue, engineQueue, running, memory, budget, hasTtft };
}

export default {
  id: "metrics",
  title: "Metrics",
  mount(root) {
    const charts = {
      tokens: new LineChart("Tokens per second (generated)", (v) => v.toFixed(v < 10 ? 1 : 0), WINDOW),
      ttft: new LineChart("Time to first token", (v) => seconds(v), WINDOW),
      queue: new LineChart("Queue", (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1)), WINDOW),
      memory: new LineChart("Memory in use (estimated)", (v) => bytes(v), WINDOW),
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
      charts.tokens.draw([{ name: "tokens/s", cls: "c1", points: s.tokens }], samples.length < 2 ? "collecting…" : "");
      charts.ttft.draw(
        [{ name: "mean in interval", cls: "c2", points: s.ttft }],
        s.hasTtft ? "" : "no loaded engine reports it (vLLM does; the Chat page measures each answer)",
      );
      charts.queue.draw([
        { name: "waiting for a runner", cls: "c3", points: s.queue },
        { name: "waiting in engines", cls: "c4", points: s.engineQueue },
        { name: "being answered", cls: "c1", points: s.running },
      ]);
      charts.memory.draw([{ name: `in use (budget ${bytes(s.budget)})`, cls: "c2", points: s.memory }]);
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
