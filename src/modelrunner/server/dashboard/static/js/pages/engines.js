// Engines and runners: every engine's status with install and uninstall (progress streamed), the loaded
// runners against the memory budget with their keep-alive left, unload, and a model's configuration (sent to
// POST /engines/_configure, which validates it as for every client).

import { getJSON, jsonLines, listModels, newestAnswers, postJSON, request } from "../api.js";
import {
  bar,
  button,
  bytes,
  clear,
  displayName,
  durationSeconds,
  field,
  h,
  modelName,
  notice,
  seconds,
  toast,
  unixTime,
} from "../dom.js";

const installs = new Map(); // engine -> {lines: [], state}: installs go on while the tab is open

export default {
  id: "engines",
  title: "Engines",
  mount(root, params) {
    const summary = h("section", { class: "card", id: "budget" });
    const enginesBox = h("div", { class: "table-wrap", id: "engines" });
    const runnersBox = h("div", { class: "table-wrap", id: "runners" });
    const configsBox = h("div", { class: "table-wrap", id: "configs" });
    const status = h("div", { class: "messages" });
    let overview = null;
    let offset = 0; // daemon clock minus this browser's
    let runners = [];
    let alive = true;
    const askRunners = newestAnswers(); // polled, and asked again after an unload
    const askEngines = newestAnswers(); // asked as an install starts, at each of its lines, and at its end

    const refresh = async () => {
      const newest = askRunners();
      try {
        const [info, ps] = await Promise.all([getJSON("/dashboard/api/overview"), getJSON("/engines/ps")]);
        if (!newest()) return;
        overview = info;
        offset = info.now - Date.now() / 1000;
        runners = ps;
        if (!alive) return;
        renderSummary();
        renderRunners();
      } catch (error) {
        if (newest()) clear(runnersBox).append(notice("error", error.message));
      }
    };
    const refreshEngines = async () => {
      const newest = askEngines();
      let engines;
      try {
        const info = await getJSON("/engines/info");
        engines = Object.entries(info.engines).map(([name, e]) => ({ name, ...e }));
      } catch {
        try {
          const plain = await getJSON("/engines/status"); // DMR's shape: {name: "Running: ..."}
          engines = Object.entries(plain).map(([name, text]) => ({ name, status: text, state: text.split(":")[0], supported: true }));
        } catch (error) {
          if (newest()) clear(enginesBox).append(notice("error", error.message));
          return;
        }
      }
      if (alive && newest()) renderEngines(engines);
    };

    const renderSummary = () => {
      const used = overview.memory_in_use;
      const budget = overview.memory_budget;
      clear(summary).append(
        h("h2", { text: "Memory" }),
        bar(budget ? used / budget : 0, "memory in use"),
        h(
          "p",
          { class: "muted" },
          `${bytes(used)} estimated in use of a ${bytes(budget)} budget · ${overview.loaded_runners} of ${overview.max_runners} runners · ${overview.queue_depth} waiting`,
        ),
      );
    };

    const renderRunners = () => {
      const now = Date.now() / 1000 + offset;
      const rows = runners.map((r) => {
        const keep = durationSeconds(r.keep_alive);
        const last = unixTime(r.last_used);
        let left;
        if (r.loading) left = "loading";
        else if (r.in_use) left = "in use";
        else if (keep === Infinity) left = "never unloads";
        else if (keep === null || last === null) left = String(r.keep_alive ?? "—");
        else left = seconds(Math.max(0, last + keep - now));
        const unload = button("Unload", async () => {
          try {
            const answer = await postJSON("/engines/unload", { models: [r.model_id || r.model_name], backend: r.backend_name });
            toast(answer.unloaded_runners ? `Unloaded ${displayName(r.model_name)}` : "Nothing unloaded: the runner is answering a request");
            refresh();
          } catch (error) {
            toast(error.message, "error");
          }
        }, "ghost small");
        return h(
          "tr",
          { dataset: { model: displayName(r.model_name), inUse: String(Boolean(r.in_use)) } },
          h("td", { class: "opt", text: r.backend_name }),
          h("td", { class: "name", text: displayName(r.model_name) }),
          h("td", { class: "opt", text: r.mode }),
          h(
            "td",
            {},
            h("span", { text: bytes(r.memory_estimate) }),
            overview && overview.memory_budget ? bar(r.memory_estimate / overview.memory_budget, "share of the budget") : null,
          ),
          h("td", { class: "keep", text: left }),
          h(
            "td",
            {},
            h("span", { class: `badge ${r.in_use ? "running" : r.loading ? "starting" : "idle"}`, text: r.in_use ? "in use" : r.loading ? "loading" : "idle" }),
            // warm resume: the runner started from a saved prompt cache (scheduler/warm.py)
            r.warm && r.warm.state === "restored"
              ? h("span", { class: "badge done warm", title: "prompt cache restored at load", text: `warm · ${r.warm.restored_tokens} tokens` })
              : null,
            // speculative decoding: how the runner drafts, and the share of its drafts the model accepted
            r.drafting
              ? h("span", {
                  class: "badge drafting",
                  title: `speculative decoding: ${r.drafting.types}` + (r.drafting.drafted_tokens ? `, ${r.drafting.accepted_tokens} of ${r.drafting.drafted_tokens} drafted tokens accepted` : ""),
                  text: r.drafting.drafted_tokens ? `drafts · ${Math.round(100 * r.drafting.acceptance_rate)}% accepted` : `drafts · ${r.drafting.types}`,
                })
              : null,
          ),
          h("td", { class: "opt mono", text: r.pid ?? "" }),
          h("td", {}, unload),
        );
      });
      clear(runnersBox).append(
        h(
          "table",
          { class: "table", id: "runners-table" },
          h("thead", {}, h("tr", {}, ["Engine", "Model", "Mode", "Memory", "Keep-alive left", "State", "PID", ""].map((t, i) => h("th", { class: [0, 2, 6].includes(i) ? "opt" : "", text: t })))),
          h("tbody", {}, rows),
        ),
      );
      if (!runners.length) runnersBox.append(h("p", { class: "muted empty", text: "No runner is loaded: models load on their first request." }));
    };

    const renderEngines = (engines) => {
      const rows = engines.map((e) => {
        const install = installs.get(e.name);
        const busy = install && install.state === "running";
        const running = e.state === "Running";
        const actions = e.supported === false
          ? h("span", { class: "muted", text: "not on this platform" })
          : e.installable === false // runs here, but modelrunner cannot install it (yet): its detail says why
          ? h("span", { class: "muted", text: "cannot be installed here" })
          : [
              button(running ? "Reinstall" : "Install", () => runInstall(e.name, running), running ? "ghost small" : "small"),
              running ? button("Uninstall", () => uninstall(e.name), "danger small") : null,
            ];
        return [
          h(
            "tr",
            { dataset: { engine: e.name } },
            h("td", { class: "name", text: e.name }),
            h("td", {}, h("span", { class: `badge ${running ? "done" : "idle"}`, text: e.state || "" })),
            h("td", { class: "opt", text: e.version || "" }),
            h("td", { class: "opt small", text: e.detail || "" }),
            h("td", { class: "actions" }, busy ? h("span", { class: "badge running", text: "installing…" }) : actions),
          ),
          install
            ? h(
                "tr",
                { class: "install-row" },
                h(
                  "td",
                  { colspan: 5 },
                  install.state === "running" ? h("progress", { "aria-label": `installing ${e.name}` }) : null,
                  h("pre", { class: "install-log", text: install.lines.slice(-12).join("\n") }),
                ),
              )
            : null,
        ];
      });
      clear(enginesBox).append(
        h(
          "table",
          { class: "table", id: "engines-table" },
          h("thead", {}, h("tr", {}, ["Engine", "Status", "Version", "Detail", ""].map((t, i) => h("th", { class: [2, 3].includes(i) ? "opt" : "", text: t })))),
          h("tbody", {}, rows),
        ),
      );
    };

    const runInstall = async (name, force) => {
      const install = { lines: [`Installing ${name}…`], state: "running" };
      installs.set(name, install);
      refreshEngines();
      try {
        const response = await request("/engines/install-backend", { method: "POST", json: { backend: name, force } });
        for await (const line of jsonLines(response)) {
          install.lines.push(line.message || JSON.stringify(line));
          if (line.type === "error") install.state = "failed";
          if (line.type === "success") install.state = "done";
          if (alive) refreshEngines();
        }
        if (install.state === "running") install.state = "failed";
      } catch (error) {
        install.state = "failed";
        install.lines.push(error.message);
      }
      toast(install.lines[install.lines.length - 1], install.state === "done" ? "info" : "error");
      if (alive) refreshEngines();
    };
    const uninstall = async (name) => {
      if (!confirm(`Uninstall ${name}? Its runners are stopped.`)) return;
      try {
        const answer = await postJSON("/engines/uninstall-backend", { backend: name });
        toast(answer.message);
        installs.delete(name);
      } catch (error) {
        toast(error.message, "error");
      }
      refreshEngines();
      refresh();
    };

    root.append(
      h("div", { class: "page-head" }, h("h1", { text: "Engines and runners" })),
      summary,
      h("section", { class: "card" }, h("h2", { text: "Loaded runners" }), runnersBox),
      h("section", { class: "card" }, h("h2", { text: "Engines" }), enginesBox),
      configureCard(params.get("configure"), () => refreshConfigs(configsBox), status),
      h("section", { class: "card" }, h("h2", { text: "Saved model settings" }), configsBox),
    );
    refresh();
    refreshEngines();
    refreshConfigs(configsBox);
    const poll = setInterval(refresh, 2000);
    const tick = setInterval(() => alive && overview && renderRunners(), 1000);
    return () => {
      alive = false;
      clearInterval(poll);
      clearInterval(tick);
    };
  },
};

async function refreshConfigs(box) {
  try {
    const configs = await getJSON("/engines/_configure");
    const rows = configs.map((c) =>
      h(
        "tr",
        {},
        h("td", { text: c.Backend }),
        h("td", { class: "name", text: displayName(c.Model) }),
        h("td", { class: "opt", text: c.Mode }),
        h("td", { class: "mono small", text: configText(c.Config || {}) }),
      ),
    );
    clear(box).append(
      h(
        "table",
        { class: "table" },
        h("thead", {}, h("tr", {}, h("th", { text: "Engine" }), h("th", { text: "Model" }), h("th", { class: "opt", text: "Mode" }), h("th", { text: "Settings" }))),
        h("tbody", {}, rows),
      ),
    );
    if (!configs.length) box.append(h("p", { class: "muted empty", text: "No model has saved settings." }));
  } catch (error) {
    clear(box).append(notice("error", error.message));
  }
}

// DMR's shape ({"context-size", "runtime-flags", keep_alive, speculative: {...}}) or our older flat one.
function configText(config) {
  return Object.entries(config)
    .map(([key, value]) => `${key}=${typeof value === "object" ? JSON.stringify(value) : value}`)
    .join("  ");
}

function configureCard(initial, onSaved, status) {
  const model = h("select", { name: "model", required: true, "aria-label": "Model to configure" });
  const context = h("input", { type: "number", name: "context-size", placeholder: "model's default (-1: its maximum)" });
  const flags = h("input", { type: "text", name: "runtime-flags", placeholder: "--threads 4 --flash-attn on" });
  const keepAlive = h("input", { type: "text", name: "keep_alive", placeholder: "5m, 1h, 0, -1 (never)" });
  const draft = h("select", { name: "draft" });
  const draftTokens = h("input", { type: "number", name: "num_tokens", min: 1, max: 128, placeholder: "default" });
  const draftRate = h("input", { type: "number", name: "min_acceptance_rate", min: 0, max: 1, step: 0.05, placeholder: "default" });
  const result = h("div", { class: "messages" });
  const form = h(
    "form",
    { class: "grid-form", id: "configure-form" },
    field("Model", model),
    field("Context size", context),
    field("Runtime flags", flags, "Checked against the engine's allowed flags."),
    field("Keep-alive", keepAlive),
    field("Speculative draft model", draft, "A GGUF model for llama.cpp; none turns it off."),
    h("div", { class: "row" }, field("Draft tokens", draftTokens), field("Min. acceptance", draftRate)),
    h("div", { class: "form-actions" }, h("button", { type: "submit", text: "Save and reload" })),
  );
  let draftTouched = false;
  draft.addEventListener("change", () => (draftTouched = true));
  listModels()
    .then((models) => {
      const options = (list) => list.map((m) => h("option", { value: m.tags[0] || m.id, text: modelName(m) }));
      model.replaceChildren(...options(models));
      draft.replaceChildren(h("option", { value: "", text: "none" }), ...options(models.filter((m) => m.config && m.config.format === "gguf")));
      if (initial) {
        const match = models.find((m) => m.tags.includes(initial) || m.id === initial || m.tags.some((t) => displayName(t) === displayName(initial)));
        if (match) model.value = match.tags[0] || match.id;
      }
    })
    .catch((error) => status.append(notice("error", error.message)));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { model: model.value };
    if (context.value !== "") body["context-size"] = Number(context.value);
    if (flags.value.trim()) body["raw-runtime-flags"] = flags.value.trim();
    if (keepAlive.value.trim()) body.keep_alive = keepAlive.value.trim();
    if (draftTouched || draftTokens.value !== "" || draftRate.value !== "") {
      body.speculative = { draft_model: draft.value };
      if (draft.value && draftTokens.value !== "") body.speculative.num_tokens = Number(draftTokens.value);
      if (draft.value && draftRate.value !== "") body.speculative.min_acceptance_rate = Number(draftRate.value);
    }
    try {
      await request("/engines/_configure", { method: "POST", json: body });
      clear(result).append(notice("ok", `Saved: ${displayName(model.value)} reloads with these settings.`));
      onSaved();
    } catch (error) {
      clear(result).append(notice("error", error.message));
    }
  });
  return h(
    "details",
    { class: "card", open: Boolean(initial), id: "configure" },
    h("summary", { text: "Configure a model" }),
    form,
    result,
    status,
  );
}
