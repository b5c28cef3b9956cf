// Models: the store as a table, search, details (config, GGUF metadata, layers, licences), tag, remove,
// export; pulls with live progress per layer; packaging from files on the daemon's machine.

import { ApiError, getJSON, getKey, jsonLines, listModels, newestAnswers, postJSON, request } from "../api.js";
import {
  ago,
  bar,
  button,
  bytes,
  clear,
  displayName,
  field,
  h,
  modelFormat,
  modelName,
  notice,
  openDialog,
  seconds,
  shortId,
  toast,
} from "../dom.js";

// Pulls outlive a visit to another page: they run as long as the tab is open.
const pulls = new Map(); // reference -> Pull

export default {
  id: "models",
  title: "Models",
  mount(root) {
    const search = h("input", { type: "search", placeholder: "Search models", "aria-label": "Search models" });
    const tableBox = h("div", { class: "table-wrap" });
    const pullBox = h("div", { class: "pulls" });
    const reference = h("input", {
      type: "text",
      name: "reference",
      placeholder: "ai/smollm2, hf.co/org/repo-GGUF:Q4_K_M, registry:5000/team/m:v1",
      "aria-label": "Model reference to pull",
      required: true,
    });
    const pullForm = h(
      "form",
      { class: "inline-form", id: "pull-form" },
      reference,
      h("button", { type: "submit", text: "Pull" }),
    );
    let models = [];
    let alive = true;

    const render = () => {
      const needle = search.value.trim().toLowerCase();
      const shown = models.filter(
        (m) => !needle || m.id.includes(needle) || m.tags.some((t) => t.toLowerCase().includes(needle)),
      );
      clear(tableBox).append(modelTable(shown, openDetails));
      if (!models.length) tableBox.append(notice("info", "No models yet: pull one above, or package a file."));
    };
    const ask = newestAnswers(); // asked at the start and again after a pull, a package, a tag or a delete
    const load = async () => {
      const newest = ask();
      try {
        const listed = await listModels();
        if (!newest()) return;
        models = listed;
        if (alive) render();
      } catch (error) {
        if (newest()) clear(tableBox).append(notice("error", error.message));
      }
    };
    const openDetails = (model) => details(model, load);

    search.addEventListener("input", render);
    pullForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const ref = reference.value.trim();
      if (!ref) return;
      startPull(ref, load);
      reference.value = "";
      renderPulls(pullBox, load);
    });

    root.append(
      h("div", { class: "page-head" }, h("h1", { text: "Models" }), search),
      h("section", { class: "card" }, h("h2", { text: "Pull a model" }), pullForm, pullBox),
      h("section", { class: "card" }, tableBox),
      packageCard(load),
    );
    renderPulls(pullBox, load);
    const timer = setInterval(() => renderPulls(pullBox, load), 500);
    load();
    return () => {
      alive = false;
      clearInterval(timer);
    };
  },
};

// The store's record of a verified signature (`verification` in /models, signing/record.py), if any.
function signedMark(verification) {
  if (!verification) return [];
  const title = `Signed by ${verification.signer} for ${verification.dockerReference}, verified ${verification.verifiedAt}`;
  return h("span", { class: "chip signed", text: "✓ verified", title });
}

function modelTable(models, onOpen) {
  const head = ["Name", "Tags", "Format", "Parameters", "Quantization", "Context", "Size", "Created", "ID", "Signed"];
  const optional = new Set(["Tags", "Quantization", "Context", "Created", "ID", "Signed"]);
  const rows = models.map((m) => {
    const cfg = m.config || {};
    const row = h(
      "tr",
      { class: "clickable", tabindex: 0, dataset: { id: m.id } },
      h("td", { class: "name" }, h("strong", { text: modelName(m) })),
      h("td", { class: "opt tags" }, m.tags.map((t) => h("span", { class: "chip", text: displayName(t), title: t }))),
      h("td", { text: modelFormat(m) }),
      h("td", { text: cfg.parameters || "" }),
      h("td", { class: "opt", text: cfg.quantization || "" }),
      h("td", { class: "opt", text: cfg.context_size ? String(cfg.context_size) : "" }),
      h("td", { text: cfg.size || "" }),
      h("td", { class: "opt", text: ago(typeof m.created === "number" ? m.created : Date.parse(m.created) / 1000) }),
      h("td", { class: "opt mono", text: shortId(m.id) }),
      h("td", { class: "opt" }, signedMark(m.verification)),
    );
    row.addEventListener("click", () => onOpen(m));
    row.addEventListener("keydown", (event) => event.key === "Enter" && onOpen(m));
    return row;
  });
  return h(
    "table",
    { class: "table", id: "models-table" },
    h("thead", {}, h("tr", {}, head.map((name) => h("th", { class: optional.has(name) ? "opt" : "", text: name })))),
    h("tbody", {}, rows),
  );
}

// -- details ------------------------------------------------------------------------------------------

function details(model, reload) {
  const name = model.tags[0] || model.id;
  const { dialog, body } = openDialog(modelName(model));
  const cfg = { ...(model.config || {}) };
  const gguf = cfg.gguf;
  delete cfg.gguf;
  const message = h("div", { class: "messages" });
  const done = (text) => {
    toast(text);
    reload();
  };
  const fail = (error) => clear(message).append(notice("error", error.message));

  const tagInput = h("input", { type: "text", placeholder: "myorg/name:tag", "aria-label": "New tag" });
  const tagForm = h("form", { class: "inline-form" }, tagInput, h("button", { type: "submit", text: "Tag" }));
  tagForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = tagInput.value.trim();
    const at = text.lastIndexOf(":");
    const [repo, tag] = at > text.lastIndexOf("/") ? [text.slice(0, at), text.slice(at + 1)] : [text, "latest"];
    try {
      const query = new URLSearchParams({ repo, tag });
      await request(`/models/${encodeURI(name)}/tag?${query}`, { method: "POST" });
      done(`Tagged ${text}`);
      dialog.close();
    } catch (error) {
      fail(error);
    }
  });

  const remove = async (what, force) => {
    if (!confirm(`Remove ${displayName(what)}?`)) return;
    try {
      await request(`/models/${encodeURI(what)}${force ? "?force=true" : ""}`, { method: "DELETE" });
      done(`Removed ${displayName(what)}`);
      dialog.close();
    } catch (error) {
      fail(error);
    }
  };
  const chips = model.tags.map((t) =>
    h(
      "span",
      { class: "chip", dataset: { tag: t } },
      t,
      model.tags.length > 1 ? h("button", { type: "button", class: "chip-remove", title: `Remove the tag ${t}`, "aria-label": `Remove the tag ${t}`, text: "×", onclick: () => remove(t, false) }) : null,
    ),
  );

  body.append(
    h("p", { class: "mono small", text: model.id }),
    h("div", { class: "chips" }, chips),
    h(
      "div",
      { class: "actions" },
      h("a", { class: "button", href: `#/chat?model=${encodeURIComponent(name)}`, text: "Chat" }),
      h("a", { class: "button ghost", href: `#/engines?configure=${encodeURIComponent(name)}`, text: "Configure" }),
      button("Export", () => exportModel(name).catch(fail), "ghost"),
      button("Remove model", () => remove(model.id, model.tags.length > 1), "danger"),
    ),
    message,
    h("h3", { text: "Tag" }),
    tagForm,
    h("h3", { text: "Configuration" }),
    keyValues(cfg),
  );
  if (gguf) body.append(h("details", {}, h("summary", { text: `GGUF metadata (${Object.keys(gguf).length})` }), keyValues(gguf)));
  const files = h("div", {}, h("p", { class: "muted", text: "Loading layers…" }));
  body.append(h("h3", { text: "Layers" }), files);
  getJSON(`/dashboard/api/models/${encodeURI(model.id)}/files`)
    .then((info) => {
      clear(files).append(
        h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "table compact" },
            h("thead", {}, h("tr", {}, h("th", { text: "File" }), h("th", { text: "Media type" }), h("th", { text: "Size" }))),
            h(
              "tbody",
              {},
              info.layers.map((l) =>
                h("tr", {}, h("td", { class: "mono", text: l.path || shortId(l.digest) }), h("td", { class: "mono small", text: l.media_type }), h("td", { text: bytes(l.size) })),
              ),
            ),
          ),
        ),
      );
      for (const licence of info.licenses) {
        files.append(
          h(
            "details",
            {},
            h("summary", { text: `Licence ${licence.path || shortId(licence.digest)}` }),
            h("pre", { class: "licence", text: licence.text + (licence.truncated ? "\n…" : "") }),
          ),
        );
      }
      if (!info.licenses.length) files.append(h("p", { class: "muted", text: "No licence file in this model." }));
    })
    .catch((error) => clear(files).append(notice("error", error.message)));
}

function keyValues(object) {
  return h(
    "dl",
    { class: "kv" },
    Object.entries(object).map(([key, value]) => [
      h("dt", { text: key }),
      h("dd", { text: typeof value === "object" ? JSON.stringify(value) : String(value) }),
    ]),
  );
}

// Without a key the browser downloads the archive itself (streamed to disk). With one, the key must go in a
// header: streamed to a file the user picks where the browser can, else gathered in memory.
async function exportModel(name) {
  const path = `/models/${encodeURI(name)}/export`;
  const filename = `${displayName(name).replace(/[^\w.-]+/g, "_")}.tar`;
  if (!getKey()) {
    const link = h("a", { href: path, download: filename });
    document.body.append(link);
    link.click();
    link.remove();
    return;
  }
  if (window.showSaveFilePicker) {
    const handle = await window.showSaveFilePicker({ suggestedName: filename });
    const response = await request(path);
    await response.body.pipeTo(await handle.createWritable());
    toast(`Exported ${filename}`);
    return;
  }
  const blob = await (await request(path)).blob();
  const url = URL.createObjectURL(blob);
  const link = h("a", { href: url, download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// -- pulls --------------------------------------------------------------------------------------------

class Pull {
  constructor(reference, onDone) {
    this.reference = reference;
    this.onDone = onDone;
    this.layers = new Map(); // id -> {size, current, started, startBytes, speed}
    this.status = "starting";
    this.message = "Starting…";
    this.error = null;
    this.started = performance.now();
    this.controller = new AbortController();
    this.resumable = true; // false once the registry refused the pull itself
  }

  async run() {
    try {
      const response = await request("/models/create", {
        method: "POST",
        json: { from: this.reference },
        accept: "application/json",
        signal: this.controller.signal,
      });
      this.status = "running";
      for await (const event of jsonLines(response)) this.update(event);
      if (this.status === "running") this.fail("the pull ended without a result; pull again to resume");
    } catch (error) {
      if (error.name === "AbortError") {
        this.status = "cancelled";
        this.message = "Cancelled: what was downloaded is kept, pull again to resume.";
      } else {
        // refused before any transfer (not found, a bad name, no access): there is nothing to resume
        this.resumable = !(error.status >= 400 && error.status < 500 && error.status !== 408 && error.status !== 429);
        this.fail(error.message);
      }
    }
  }

  update(event) {
    if (event.type === "error") return this.fail(event.message);
    if (event.type === "success") {
      this.status = "done";
      this.message = event.message;
      for (const layer of this.layers.values()) layer.current = layer.size;
      this.onDone();
      return;
    }
    if (event.message) this.message = event.message;
    const layer = event.layer;
    if (!layer || !layer.id) return;
    const now = performance.now();
    const known = this.layers.get(layer.id) || { size: layer.size, current: 0, started: now, startBytes: layer.current, speed: 0, at: now };
    if (layer.current > known.current && now > known.at) {
      const instant = ((layer.current - known.current) * 1000) / (now - known.at);
      known.speed = known.speed ? known.speed * 0.7 + instant * 0.3 : instant;
    }
    known.size = layer.size;
    known.current = layer.current;
    known.at = now;
    this.layers.set(layer.id, known);
  }

  fail(message) {
    this.status = "failed";
    this.error = message;
    this.message = message;
  }

  get active() {
    return this.status === "starting" || this.status === "running";
  }
}

function startPull(reference, onDone) {
  const existing = pulls.get(reference);
  if (existing && existing.active) return;
  const pull = new Pull(reference, onDone);
  pulls.set(reference, pull);
  pull.run();
}

function renderPulls(box, onDone) {
  const cards = [...pulls.values()].reverse().map((pull) => {
    const total = [...pull.layers.values()].reduce((sum, l) => sum + l.size, 0);
    const current = [...pull.layers.values()].reduce((sum, l) => sum + l.current, 0);
    const actions = pull.active
      ? [button("Cancel", () => pull.controller.abort(), "ghost")]
      : [
          pull.status !== "done" && pull.resumable ? button("Resume", () => startPull(pull.reference, onDone)) : null,
          button("Dismiss", () => pulls.delete(pull.reference) && renderPulls(box, onDone), "ghost"),
        ];
    return h(
      "div",
      { class: `pull ${pull.status}`, dataset: { reference: pull.reference, status: pull.status } },
      h(
        "div",
        { class: "pull-head" },
        h("strong", { text: pull.reference }),
        h("span", { class: `badge ${pull.status}`, text: pull.status }),
        h("span", { class: "muted", text: total ? `${bytes(current)} of ${bytes(total)}` : "" }),
        h("span", { class: "spacer" }),
        actions,
      ),
      total ? bar(current / total, "all layers") : null,
      h("div", { class: "pull-message", text: pull.message }),
      h(
        "div",
        { class: "layers" },
        [...pull.layers.entries()].filter(([, l]) => l.size > 0).map(([id, l]) => {
          const left = l.speed > 0 && l.current < l.size ? (l.size - l.current) / l.speed : null;
          return h(
            "div",
            { class: "layer", dataset: { layer: id } },
            h("span", { class: "mono small", text: shortId(id) }),
            bar(l.size ? l.current / l.size : 0, id),
            h(
              "span",
              { class: "small layer-text" },
              `${bytes(l.current)} / ${bytes(l.size)}`,
              l.current < l.size && l.speed ? ` · ${bytes(l.speed)}/s · ${seconds(left)} left` : "",
            ),
          );
        }),
      ),
    );
  });
  box.replaceChildren(...cards);
}

// -- packaging --------------------------------------------------------------------------------------

// The daemon reads files by path only for the user it runs as (or root): it knows a browser as that user by
// the owner of the browser's connection, never by the API key (which every client of the API is given).
function notYourFiles(reason) {
  return h(
    "div",
    { class: "notice warn", role: "status", title: `The model runner says: ${reason}` },
    "This browser does not run as the model runner's user, so the model runner does not read files by path for it. ",
    "Package from a terminal instead: ",
    h("code", { text: "model package --gguf /path/to/model.gguf myorg/model:tag" }),
    " reads the files as you and uploads them.",
  );
}

function packageCard(onDone) {
  const target = h("input", { type: "text", name: "target", placeholder: "myorg/model:tag", required: true });
  const kind = h(
    "select",
    { name: "kind" },
    h("option", { value: "gguf", text: "GGUF file" }),
    h("option", { value: "safetensors_dir", text: "Safetensors folder" }),
    h("option", { value: "dduf", text: "DDUF file" }),
  );
  const path = h("input", { type: "text", name: "path", placeholder: "/absolute/path/on/the/daemon/machine", required: true });
  const licences = h("input", { type: "text", name: "licenses", placeholder: "/path/LICENSE, … (optional)" });
  const context = h("input", { type: "number", name: "context", min: 1, placeholder: "from the model" });
  const access = h("div", { class: "messages", id: "package-access" });
  const result = h("div", { class: "messages" });
  const submit = h("button", { type: "submit", text: "Package" });
  const form = h(
    "form",
    { class: "grid-form", id: "package-form" },
    field("Name", target),
    field("Kind", kind),
    field("Path", path, "Read by the model runner itself, for its own user on its own machine."),
    field("Licence files", licences),
    field("Context size", context),
    h("div", { class: "form-actions" }, submit),
  );
  const refuse = (reason) => {
    for (const element of form.elements) element.disabled = true;
    clear(access).append(notYourFiles(reason));
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { target: target.value.trim(), [kind.value]: path.value.trim() };
    const list = licences.value.split(",").map((s) => s.trim()).filter(Boolean);
    if (list.length) body.licenses = list;
    if (context.value) body.context_size = Number(context.value);
    submit.disabled = true;
    clear(result).append(notice("info", "Packaging… (the model runner hashes and copies the files)"));
    try {
      const answer = await postJSON("/models/package", body);
      clear(result).append(notice("ok", `${answer.message}: ${answer.tags.map(displayName).join(", ")} (${shortId(answer.id)})`));
      onDone();
    } catch (error) {
      if (error instanceof ApiError && error.status === 403) {
        clear(result);
        refuse(error.message);
        return;
      }
      clear(result).append(notice("error", error instanceof ApiError ? error.message : String(error)));
    } finally {
      if (!form.elements[0].disabled) submit.disabled = false;
    }
  });
  const card = h("details", { class: "card", id: "package" }, h("summary", { text: "Package files on the model runner's machine" }), access, form, result);
  card.addEventListener(
    "toggle",
    () => {
      getJSON("/dashboard/api/caller")
        .then((caller) => caller.reads_files || refuse(caller.reason))
        .catch((error) => clear(access).append(notice("error", error.message)));
    },
    { once: true },
  );
  return card;
}
