// Chat playground: one prompt to one or several models side by side, answers streamed with time to first
// token and tokens per second, a stop button that ends the generation (the request is aborted, the daemon
// cancels the engine's work), Markdown rendered as DOM nodes, the conversation kept in local storage.

import { ApiError, listModels, postJSON, request, sseEvents } from "../api.js";
import { button, clear, field, h, isImageModel, modelName, notice, seconds } from "../dom.js";
import { renderMarkdown } from "../markdown.js";

const STORE = "modelrunner.chat.v1";
const MAX_PANES = 4;

function loadState() {
  try {
    const state = JSON.parse(localStorage.getItem(STORE) || "null");
    if (state && Array.isArray(state.panes) && state.panes.length) return state;
  } catch {
    // a broken saved state starts afresh
  }
  return { system: "", params: {}, applied: {}, panes: [{ model: "", messages: [] }] };
}

function saveState(state) {
  localStorage.setItem(STORE, JSON.stringify(state));
}

let running = null; // {controller} of the generation in progress (survives page switches until it ends)

export default {
  id: "chat",
  title: "Chat",
  mount(root, params) {
    const state = loadState();
    const wanted = params.get("model");
    if (wanted) state.panes[0].model = wanted;
    let models = [];

    const system = h("textarea", { rows: 3, placeholder: "You are a helpful assistant.", "aria-label": "System prompt" });
    system.value = state.system || "";
    const number = (name, attrs) => {
      const input = h("input", { type: "number", name, ...attrs });
      input.value = state.params[name] ?? "";
      return input;
    };
    const temperature = number("temperature", { min: 0, max: 2, step: 0.05, placeholder: "default" });
    const topP = number("top_p", { min: 0, max: 1, step: 0.05, placeholder: "default" });
    const maxTokens = number("max_tokens", { min: 1, step: 1, placeholder: "default" });
    const context = number("context", { min: 1, step: 1, placeholder: "model's" });
    const extra = h("textarea", { name: "extra", rows: 2, class: "mono small", placeholder: '{"seed": 1, "top_k": 40}' });
    extra.value = state.params.extra ?? "";
    const settings = h(
      "form",
      { class: "card chat-settings", id: "chat-settings" },
      field("System prompt", system),
      h(
        "div",
        { class: "row" },
        field("Temperature", temperature),
        field("Top p", topP),
        field("Max tokens", maxTokens),
        field("Context size", context, "Changing it reloads the model."),
      ),
      h("details", {}, h("summary", { text: "More request fields" }), field("JSON merged into each request", extra)),
    );
    settings.addEventListener("input", () => {
      state.system = system.value;
      state.params = {
        temperature: temperature.value,
        top_p: topP.value,
        max_tokens: maxTokens.value,
        context: context.value,
        extra: extra.value,
      };
      saveState(state);
    });
    settings.addEventListener("submit", (event) => event.preventDefault());

    const panesBox = h("div", { class: "panes" });
    const prompt = h("textarea", { id: "prompt", rows: 2, placeholder: "Message (Enter to send, Shift+Enter for a new line)", "aria-label": "Message" });
    const send = h("button", { type: "submit", id: "send", text: "Send" });
    const stop = h("button", { type: "button", id: "stop", class: "danger", text: "Stop", disabled: true });
    const composer = h("form", { class: "composer" }, prompt, send, stop);
    const status = h("div", { class: "messages" });

    const paneViews = [];
    const renderPanes = () => {
      paneViews.length = 0;
      clear(panesBox);
      panesBox.dataset.count = String(state.panes.length);
      state.panes.forEach((pane, index) => {
        const view = paneView(pane, index);
        paneViews.push(view);
        panesBox.append(view.element);
      });
    };

    const paneView = (pane, index) => {
      const select = h("select", { class: "model-select", "aria-label": `Model ${index + 1}` });
      fillModels(select, models, pane.model);
      select.addEventListener("change", () => {
        pane.model = select.value;
        saveState(state);
      });
      const list = h("div", { class: "chat-log" });
      for (const message of pane.messages) list.append(messageView(message).element);
      const remove = state.panes.length > 1
        ? button("Remove", () => {
            state.panes.splice(index, 1);
            saveState(state);
            renderPanes();
          }, "ghost small")
        : null;
      const element = h("section", { class: "card pane", dataset: { pane: String(index) } }, h("header", {}, select, remove), list);
      return { element, list, select };
    };

    const addPane = button("Compare with another model", () => {
      if (state.panes.length >= MAX_PANES) return;
      const used = new Set(state.panes.map((p) => p.model));
      const next = models.find((m) => !used.has(m.tags[0] || m.id));
      state.panes.push({ model: next ? next.tags[0] || next.id : state.panes[0].model, messages: [] });
      saveState(state);
      renderPanes();
    }, "ghost");
    const reset = button("New conversation", () => {
      for (const pane of state.panes) pane.messages = [];
      saveState(state);
      renderPanes();
    }, "ghost");

    const setBusy = (busy) => {
      send.disabled = busy;
      stop.disabled = !busy;
      composer.classList.toggle("busy", busy);
    };

    const submit = async () => {
      const text = prompt.value.trim();
      if (!text || running) return;
      const panes = state.panes.filter((p) => p.model);
      if (!panes.length) {
        clear(status).append(notice("error", "Pick a model first."));
        return;
      }
      clear(status);
      let fields = {};
      try {
        fields = extra.value.trim() ? JSON.parse(extra.value) : {};
        if (typeof fields !== "object" || Array.isArray(fields) || fields === null) throw new Error("not an object");
      } catch (error) {
        status.append(notice("error", `More request fields must be a JSON object (${error.message}).`));
        return;
      }
      prompt.value = "";
      const controller = new AbortController();
      running = { controller };
      setBusy(true);
      try {
        await applyContext(state, panes, context.value, status);
        await Promise.all(
          panes.map((pane) => {
            const view = paneViews[state.panes.indexOf(pane)];
            return generate(pane, text, state, fields, view, controller.signal);
          }),
        );
      } finally {
        running = null;
        saveState(state);
        setBusy(false);
      }
    };
    composer.addEventListener("submit", (event) => {
      event.preventDefault();
      submit();
    });
    prompt.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        submit();
      }
    });
    stop.addEventListener("click", () => running && running.controller.abort());

    root.append(
      h("div", { class: "page-head" }, h("h1", { text: "Chat" }), h("div", { class: "actions" }, addPane, reset)),
      h("div", { class: "chat" }, settings, h("div", { class: "chat-main" }, panesBox, status, composer)),
    );
    renderPanes();
    setBusy(Boolean(running));
    listModels()
      .then((all) => {
        models = all.filter((m) => !isImageModel(m));
        if (!state.panes[0].model && models.length) state.panes[0].model = models[0].tags[0] || models[0].id;
        for (const view of paneViews) fillModels(view.select, models, state.panes[paneViews.indexOf(view)].model);
        if (!models.length) status.append(notice("info", "No chat model in the store: pull or package one on the Models page."));
      })
      .catch((error) => status.append(notice("error", error.message)));
    return null; // a generation in progress goes on; its answer is saved when it ends
  },
};

function fillModels(select, models, current) {
  const options = models.map((m) => {
    const value = m.tags[0] || m.id;
    return h("option", { value, text: modelName(m), selected: value === current });
  });
  if (current && !models.some((m) => (m.tags[0] || m.id) === current)) {
    options.unshift(h("option", { value: current, text: current, selected: true }));
  }
  select.replaceChildren(...options);
}

// The context size is a model setting (POST /engines/_configure), not a request field: set it when it changed.
async function applyContext(state, panes, value, status) {
  state.applied = state.applied || {};
  for (const pane of panes) {
    const wanted = value ? Number(value) : null;
    if (wanted === null || state.applied[pane.model] === wanted) continue;
    try {
      await postJSON("/engines/_configure", { model: pane.model, "context-size": wanted });
      state.applied[pane.model] = wanted;
    } catch (error) {
      status.append(notice("error", `Context size for ${pane.model}: ${error.message}`));
    }
  }
}

function messageView(message) {
  const body = h("div", { class: "msg-body" });
  const thinking = h("details", { class: "thinking", hidden: true }, h("summary", { text: "Reasoning" }), h("div", { class: "thinking-text" }));
  const stats = h("div", { class: "msg-stats" });
  const element = h("article", { class: `msg ${message.role}`, dataset: { state: message.state || "done" } }, thinking, body, stats);
  const render = () => {
    if (message.role === "assistant") body.replaceChildren(renderMarkdown(message.content || ""));
    else body.textContent = message.content;
    if (message.reasoning) {
      thinking.hidden = false;
      thinking.querySelector(".thinking-text").textContent = message.reasoning;
    }
    element.dataset.state = message.state || "done";
    stats.textContent = statsText(message);
  };
  render();
  return { element, render };
}

function statsText(message) {
  const s = message.stats;
  if (!s) return "";
  const parts = [];
  if (s.ttft !== undefined) parts.push(`first token ${seconds(s.ttft)}`);
  if (s.tps) parts.push(`${s.tps.toFixed(1)} tokens/s`);
  if (s.tokens) parts.push(`${s.tokens} tokens`);
  if (message.state === "stopped") parts.push("stopped");
  // the engine stopped at the token limit (finish_reason "length"): the text looks finished otherwise
  if (s.finish === "length") parts.push("cut short: it reached the token limit (max tokens or context size)");
  if (message.state === "streaming") parts.push("…");
  return parts.join(" · ");
}

async function generate(pane, text, state, fields, view, signal) {
  const history = pane.messages.filter((m) => m.state !== "error").map((m) => ({ role: m.role, content: m.content }));
  const user = { role: "user", content: text };
  const answer = { role: "assistant", content: "", state: "streaming", stats: {} };
  pane.messages.push(user, answer);
  view.list.append(messageView(user).element);
  const shown = messageView(answer);
  view.list.append(shown.element);
  shown.element.scrollIntoView({ block: "end" });

  const messages = [];
  if (state.system && state.system.trim()) messages.push({ role: "system", content: state.system });
  messages.push(...history, user);
  const body = { ...fields, model: pane.model, messages, stream: true, stream_options: { include_usage: true } };
  const p = state.params || {};
  if (p.temperature !== "" && p.temperature !== undefined) body.temperature = Number(p.temperature);
  if (p.top_p !== "" && p.top_p !== undefined) body.top_p = Number(p.top_p);
  if (p.max_tokens !== "" && p.max_tokens !== undefined) body.max_tokens = Number(p.max_tokens);

  const started = performance.now();
  let first = null;
  let chunks = 0;
  let frame = 0;
  const redraw = () => {
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const elapsed = first === null ? 0 : (performance.now() - first) / 1000;
      if (elapsed > 0 && chunks > 1) answer.stats.tps = (chunks - 1) / elapsed;
      answer.stats.tokens = chunks;
      shown.render();
      const log = view.list;
      if (log.scrollHeight - log.scrollTop - log.clientHeight < 80) log.scrollTop = log.scrollHeight;
    });
  };
  try {
    const response = await request("/engines/v1/chat/completions", { method: "POST", json: body, signal, accept: "text/event-stream" });
    for await (const event of sseEvents(response)) {
      if (event.event === "error") throw new ApiError(500, errorText(event.data));
      if (event.data === "[DONE]") break;
      let chunk;
      try {
        chunk = JSON.parse(event.data);
      } catch {
        continue;
      }
      if (chunk.error) throw new ApiError(500, errorText(chunk.error));
      const choice = chunk.choices && chunk.choices[0];
      if (choice && choice.finish_reason) answer.stats.finish = choice.finish_reason;
      const delta = choice && choice.delta;
      if (delta && (delta.content || delta.reasoning_content)) {
        if (first === null) {
          first = performance.now();
          answer.stats.ttft = (first - started) / 1000;
        }
        chunks += 1;
        answer.content += delta.content || "";
        answer.reasoning = (answer.reasoning || "") + (delta.reasoning_content || "");
        redraw();
      }
      if (chunk.usage && chunk.usage.completion_tokens) {
        answer.stats.tokens = chunk.usage.completion_tokens;
        const t = chunk.timings;
        // llama.cpp reports its own generation speed; else measure it from the first token to the last
        answer.stats.tps = t && t.predicted_per_second ? t.predicted_per_second : answer.stats.tps;
      }
    }
    answer.state = "done";
  } catch (error) {
    if (error.name === "AbortError") answer.state = "stopped";
    else {
      answer.state = "error";
      answer.content += (answer.content ? "\n\n" : "") + `Error: ${error.message}`;
    }
  }
  if (frame) cancelAnimationFrame(frame);
  const elapsed = first === null ? 0 : (performance.now() - first) / 1000;
  if (!answer.stats.tokens) answer.stats.tokens = chunks;
  if (answer.state !== "done" || !answer.stats.tps) answer.stats.tps = elapsed > 0 && chunks > 1 ? (chunks - 1) / elapsed : 0;
  if (!answer.reasoning) delete answer.reasoning;
  shown.render();
}

function errorText(data) {
  if (typeof data === "object") return data.message || JSON.stringify(data);
  try {
    const parsed = JSON.parse(data);
    return (parsed.error && parsed.error.message) || parsed.message || data;
  } catch {
    return data;
  }
}
