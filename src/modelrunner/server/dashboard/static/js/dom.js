// Building the page from elements, never from markup strings: every text goes in as a text node, so nothing from the daemon or a
// model is ever parsed as markup.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

const SVG = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") el.textContent = value;
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) if (child) el.append(child);
  return el;
}

// -- formatting ----------------------------------------------------------------------------------------

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  let value = Number(n);
  while (Math.abs(value) >= 1000 && i < units.length - 1) {
    value /= 1000;
    i += 1;
  }
  return `${i === 0 ? value : value.toFixed(value >= 100 ? 0 : value >= 10 ? 1 : 2)} ${units[i]}`;
}

export function seconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

export function ago(unixSeconds) {
  if (!unixSeconds) return "—";
  const delta = Date.now() / 1000 - unixSeconds;
  if (delta < 60) return "just now";
  if (delta < 3600) return `${Math.floor(delta / 60)} minutes ago`;
  if (delta < 86400) return `${Math.floor(delta / 3600)} hours ago`;
  if (delta < 86400 * 60) return `${Math.floor(delta / 86400)} days ago`;
  return new Date(unixSeconds * 1000).toISOString().slice(0, 10);
}

// A time as a Unix number, from a number (seconds) or an RFC 3339 string (DMR's newer `last_used`).
export function unixTime(value) {
  if (typeof value === "number") return value;
  if (typeof value === "string" && value) {
    const ms = Date.parse(value);
    return Number.isNaN(ms) ? null : ms / 1000;
  }
  return null;
}

// Seconds of a keep-alive: Go durations ("5m0s", "1h30m", "300ms"), "-1" (never: Infinity), plain numbers.
export function durationSeconds(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "number") return value < 0 ? Infinity : value;
  const text = String(value).trim();
  if (/^-?\d+(\.\d+)?$/.test(text)) return Number(text) < 0 ? Infinity : Number(text);
  if (text.startsWith("-")) return Infinity;
  const units = { h: 3600, m: 60, s: 1, ms: 0.001, us: 1e-6, "µs": 1e-6, ns: 1e-9 };
  let total = 0;
  let matched = "";
  for (const part of text.matchAll(/(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)/g)) {
    total += Number(part[1]) * units[part[2]];
    matched += part[0];
  }
  return matched === text ? total : null;
}

// `index.docker.io/ai/smollm2:latest` -> `smollm2`, as the CLI's tables show names (reference.display_name).
export function displayName(tag) {
  let name = String(tag);
  for (const prefix of ["index.docker.io/", "docker.io/"]) {
    if (name.startsWith(prefix)) {
      name = name.slice(prefix.length);
      break;
    }
  }
  if (name.startsWith("ai/")) name = name.slice(3);
  if (name.endsWith(":latest")) name = name.slice(0, -7);
  return name;
}

export function shortId(id) {
  return String(id || "").replace(/^sha256:/, "").slice(0, 12);
}

export function modelName(model) {
  return model.tags && model.tags.length ? displayName(model.tags[0]) : shortId(model.id);
}

export function modelFormat(model) {
  return (model.config && model.config.format) || "";
}

export function isImageModel(model) {
  return ["dduf", "diffusers"].includes(modelFormat(model));
}

// -- small widgets -----------------------------------------------------------------------------------

export function notice(kind, message) {
  return h("div", { class: `notice ${kind}`, role: kind === "error" ? "alert" : "status", text: message });
}

export function bar(fraction, label) {
  const fill = h("div", { class: "bar-fill" });
  fill.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`;
  return h("div", { class: "bar", title: label || "" }, fill);
}

export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", { text: label }), input, hint ? h("small", { text: hint }) : null);
}

export function button(text, onclick, cls = "") {
  return h("button", { type: "button", class: cls, onclick, text });
}

let toastTimer = null;
export function toast(message, kind = "info") {
  const box = document.getElementById("toast");
  if (!box) return;
  box.className = `toast ${kind} show`;
  box.textContent = message;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => box.classList.remove("show"), kind === "error" ? 8000 : 3500);
}

export function prettyJSON(text) {
  if (text === undefined || text === null || text === "") return "";
  if (typeof text !== "string") return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// A <dialog> with a title and a close button; returns {dialog, body}; removed from the page when closed.
export function openDialog(title) {
  const body = h("div", { class: "dialog-body" });
  const dialog = h(
    "dialog",
    { class: "dialog" },
    h("header", {}, h("h2", { text: title }), button("Close", () => dialog.close(), "ghost close")),
    body,
  );
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  return { dialog, body };
}
