// Requests: the daemon's request recorder (DMR's GET /engines/requests): recent requests per model, with
// their bodies on click. One follow stream (`include_existing=true`) gives the kept records
// (`existing_request`, running ones too), `connected`, then each request as it finishes (`new_request`).
// The daemon adds the follower before it lists the records, so none is lost between the list and the follow
// (a GET, then a follow, lost those that ended in between); rows are keyed by record id, and a later event
// replaces an earlier row. Beside DMR's fields each record has ours: duration_ms and ttfb_ms (the access
// line's), prompt_tokens and completion_tokens.

import { request, sseEvents } from "../api.js";
import { clear, displayName, h, notice, openDialog, prettyJSON, seconds } from "../dom.js";

export default {
  id: "requests",
  title: "Requests",
  mount(root) {
    const box = h("div", { class: "table-wrap", id: "requests" });
    const status = h("div", { class: "messages" });
    const records = new Map(); // id -> record (with its model)
    const controller = new AbortController();

    const add = (groups) => {
      for (const group of groups || []) {
        for (const record of group.records || []) {
          const known = records.get(record.id);
          if (known && known.status_code && !record.status_code) continue; // a finished record stays finished
          records.set(record.id, { ...record, model: record.model || group.model });
        }
      }
    };
    const render = () => {
      const sorted = [...records.values()].sort((a, b) => (b.timestamp || 0) - (a.timestamp || 0));
      const rows = sorted.map((r) => {
        const row = h(
          "tr",
          { class: "clickable", tabindex: 0, dataset: { id: r.id } },
          h("td", { class: "opt", text: r.timestamp ? new Date(r.timestamp * 1000).toLocaleTimeString() : "" }),
          h("td", { class: "name" }, displayName(r.model || ""), h("span", { class: "narrow-only mono small route" }, breakable(r.url || ""))),
          h("td", { class: "mono small wide-only", text: `${r.method || ""} ${r.url || ""}` }),
          h("td", {}, h("span", { class: `badge ${statusClass(r.status_code)}`, text: r.status_code ? String(r.status_code) : "…" })),
          h("td", { class: "num", text: milliseconds(r.duration_ms) }),
          h("td", { class: "num opt", text: milliseconds(r.ttfb_ms) }),
          h("td", { class: "num", text: tokens(r) }),
        );
        row.addEventListener("click", () => show(r));
        row.addEventListener("keydown", (event) => event.key === "Enter" && show(r));
        return row;
      });
      clear(box).append(
        h(
          "table",
          { class: "table", id: "requests-table" },
          h("thead", {}, h("tr", {}, h("th", { class: "opt", text: "Time" }), h("th", { text: "Model" }), h("th", { class: "wide-only", text: "Route" }), h("th", { text: "Status" }), h("th", { class: "num", text: "Duration" }), h("th", { class: "num opt", text: "First byte" }), h("th", { class: "num", text: "Tokens" }))),
          h("tbody", {}, rows),
        ),
      );
      if (!rows.length) box.append(h("p", { class: "muted empty", text: "No request recorded yet: chat with a model and it shows here." }));
    };

    const card = h("section", { class: "card" }, box);
    root.append(h("div", { class: "page-head" }, h("h1", { text: "Requests" })), status, card);

    const follow = async () => {
      let response;
      try {
        response = await request("/engines/requests?include_existing=true", { accept: "text/event-stream", signal: controller.signal });
      } catch (error) {
        if (error.name === "AbortError") return;
        const missing = error.status === 404 || error.status === 405;
        card.hidden = true;
        status.append(notice(missing ? "info" : "error", missing ? "This model runner has no request recorder (GET /engines/requests)." : error.message));
        return;
      }
      let listed = false; // the kept records are shown at once, when `connected` says they are all here
      try {
        for await (const event of sseEvents(response)) {
          if (event.event === "existing_request" || event.event === "new_request") add(JSON.parse(event.data));
          if (event.event === "connected") listed = true;
          if (listed && event.event !== "existing_request") render();
        }
      } catch (error) {
        if (error.name !== "AbortError") status.append(notice("error", `Live updates stopped: ${error.message}`));
      }
      if (!listed && !controller.signal.aborted) render();
    };
    follow();
    return () => controller.abort();
  },
};

function statusClass(code) {
  if (!code) return "running";
  return code < 400 ? "done" : "failed";
}

// A path that may wrap after each slash (on a phone), never inside a word.
function breakable(path) {
  return path.split("/").flatMap((part, i) => (i ? ["/", h("wbr"), part] : [part]));
}

function milliseconds(value) {
  return typeof value === "number" ? seconds(value / 1000) : "—";
}

// prompt → answer, as the answer counted them (absent when it did not say)
function tokens(record) {
  const prompt = record.prompt_tokens;
  const completion = record.completion_tokens;
  if (prompt === undefined && completion === undefined) return "—";
  return `${prompt ?? "?"} → ${completion ?? "?"}`;
}

function show(record) {
  const { body } = openDialog(`${record.method || ""} ${record.url || ""}`);
  const meta = [
    ["Model", record.model],
    ["Status", record.status_code],
    ["Time", record.timestamp ? new Date(record.timestamp * 1000).toLocaleString() : ""],
    ["Duration", milliseconds(record.duration_ms)],
    ["First byte after", milliseconds(record.ttfb_ms)],
    ["Tokens (prompt → answer)", tokens(record)],
    ["Client", record.user_agent],
    ["Request ID", record.request_id],
    ["Origin", record.origin],
  ].filter(([, value]) => value !== undefined && value !== "" && value !== null);
  body.append(
    h("dl", { class: "kv" }, meta.map(([key, value]) => [h("dt", { text: key }), h("dd", { text: String(value) })])),
    h("h3", { text: "Request" }),
    h("pre", { class: "body", text: prettyJSON(record.request) }),
    h("h3", { text: record.error ? "Error" : "Response" }),
    h("pre", { class: "body", text: prettyJSON(record.error || record.response) }),
  );
}
