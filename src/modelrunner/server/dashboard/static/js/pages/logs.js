// Logs: the daemon's and the engines' logs from GET /logs, followed live.

import { lines, request } from "../api.js";
import { clear, field, h, notice } from "../dom.js";

const MAX_LINES = 4000;

export default {
  id: "logs",
  title: "Logs",
  mount(root) {
    const source = h(
      "select",
      { name: "source" },
      h("option", { value: "all", text: "Daemon and engines" }),
      h("option", { value: "daemon", text: "Daemon only" }),
    );
    const model = h("input", { type: "text", name: "model", placeholder: "all models" });
    const filter = h("input", { type: "search", name: "filter", placeholder: "Filter lines" });
    const follow = h("input", { type: "checkbox", name: "follow", checked: true });
    const view = h("div", { class: "log", id: "log", role: "log", "aria-live": "off" });
    const status = h("div", { class: "messages" });
    let controller = null;

    const accept = (line) => !filter.value || line.toLowerCase().includes(filter.value.toLowerCase());
    const lineView = (line) => {
      const level = (line.match(/\blevel=(\w+)/) || line.match(/\b(ERROR|WARNING|WARN|INFO|DEBUG)\b/) || [])[1];
      return h("div", { class: `line ${level ? level.toLowerCase() : ""}`, hidden: !accept(line), text: line });
    };

    const start = async () => {
      if (controller) controller.abort();
      controller = new AbortController();
      const mine = controller;
      clear(view);
      clear(status);
      const query = new URLSearchParams();
      if (follow.checked) query.set("follow", "true");
      if (source.value === "daemon") query.set("no-engines", "true");
      if (model.value.trim()) query.set("model", model.value.trim());
      try {
        const response = await request(`/logs?${query}`, { signal: mine.signal });
        let pending = [];
        let frame = 0;
        const flush = () => {
          frame = 0;
          const atBottom = view.scrollHeight - view.scrollTop - view.clientHeight < 40;
          view.append(...pending.map(lineView));
          pending = [];
          while (view.childElementCount > MAX_LINES) view.firstElementChild.remove();
          if (atBottom) view.scrollTop = view.scrollHeight;
        };
        for await (const line of lines(response)) {
          if (mine.signal.aborted) break;
          pending.push(line);
          if (!frame) frame = requestAnimationFrame(flush);
        }
        if (frame) cancelAnimationFrame(frame);
        flush();
        if (!follow.checked) status.append(notice("info", "End of the logs (turn on Follow to see new lines)."));
      } catch (error) {
        if (error.name !== "AbortError") status.append(notice("error", error.message));
      }
    };

    for (const input of [source, follow]) input.addEventListener("change", start);
    model.addEventListener("change", start);
    filter.addEventListener("input", () => {
      for (const line of view.children) line.hidden = !accept(line.textContent);
    });

    root.append(
      h("div", { class: "page-head" }, h("h1", { text: "Logs" })),
      h(
        "form",
        { class: "card row log-controls" },
        field("Source", source),
        field("Model", model),
        field("Filter", filter),
        h("label", { class: "check" }, follow, " Follow"),
      ),
      status,
      view,
    );
    root.querySelector("form").addEventListener("submit", (event) => event.preventDefault());
    start();
    return () => controller && controller.abort();
  },
};
