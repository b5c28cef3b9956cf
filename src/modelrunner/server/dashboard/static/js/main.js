// The dashboard's shell: navigation by URL hash, the API key field, and the daemon's version.

import { getJSON, getKey, onAuth, setKey } from "./api.js";
import { clear, h, toast } from "./dom.js";
import chat from "./pages/chat.js";
import engines from "./pages/engines.js";
import images from "./pages/images.js";
import logs from "./pages/logs.js";
import metrics from "./pages/metrics.js";
import models from "./pages/models.js";
import requests from "./pages/requests.js";

const PAGES = [models, chat, images, engines, requests, logs, metrics];
const main = document.getElementById("page");
const nav = document.getElementById("nav");
const auth = document.getElementById("auth");
let unmount = null;

for (const page of PAGES) nav.append(h("a", { href: `#/${page.id}`, dataset: { page: page.id }, text: page.title }));

function route() {
  const [id, query] = location.hash.replace(/^#\/?/, "").split("?");
  const page = PAGES.find((p) => p.id === id) || models;
  if (unmount) unmount();
  unmount = null;
  for (const link of nav.querySelectorAll("a")) {
    link.classList.toggle("active", link.dataset.page === page.id);
    if (link.dataset.page === page.id) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${page.title} · modelrunner`;
  clear(main);
  main.dataset.page = page.id;
  const params = new URLSearchParams(query || "");
  unmount = page.mount(main, params) || null;
}

onAuth((state) => {
  auth.hidden = state === "ok" || state === null;
  if (state !== "ok" && state !== null) auth.textContent = state;
});

const keyInput = document.getElementById("api-key");
keyInput.value = getKey();
document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setKey(keyInput.value.trim());
  toast(keyInput.value.trim() ? "API key kept for this browser tab" : "API key cleared");
  refreshDaemon();
  route();
});
document.getElementById("key-clear").addEventListener("click", () => {
  keyInput.value = "";
  setKey("");
  refreshDaemon();
  route();
});

async function refreshDaemon() {
  const box = document.getElementById("daemon");
  try {
    const info = await getJSON("/dashboard/api/overview");
    box.textContent = `v${info.version}`;
    box.title = "modelrunner daemon version";
  } catch (error) {
    box.textContent = error.status === 401 ? "locked" : "unreachable";
  }
}

window.addEventListener("hashchange", route);
route();
refreshDaemon();
document.body.dataset.ready = "true"; // the browser tests wait for this
performance.mark("dashboard-interactive");
