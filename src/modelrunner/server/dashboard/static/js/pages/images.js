// Images: DDUF models through /engines/v1/images/generations; the PNG shown and downloadable.

import { listModels, postJSON } from "../api.js";
import { clear, field, h, isImageModel, modelName, notice, seconds } from "../dom.js";

const gallery = []; // {url, name, caption} of this tab's images, newest first

export default {
  id: "images",
  title: "Images",
  mount(root) {
    const model = h("select", { name: "model", "aria-label": "Image model" });
    const prompt = h("textarea", { name: "prompt", rows: 3, required: true, placeholder: "A watercolour of a lighthouse at dawn" });
    const negative = h("input", { type: "text", name: "negative", placeholder: "optional" });
    const width = h("input", { type: "number", name: "width", min: 64, max: 2048, step: 8, value: 512 });
    const height = h("input", { type: "number", name: "height", min: 64, max: 2048, step: 8, value: 512 });
    // the engine's default (diffusers_server/params.py), which `model run` leaves it to: one default
    const steps = h("input", { type: "number", name: "steps", min: 1, max: 150, value: 50 });
    const seed = h("input", { type: "number", name: "seed", min: 0, step: 1, placeholder: "random" });
    const submit = h("button", { type: "submit", text: "Generate" });
    const status = h("div", { class: "messages" });
    const results = h("div", { class: "gallery", id: "gallery" });
    const form = h(
      "form",
      { class: "card stack-form", id: "image-form" },
      field("Model", model),
      field("Prompt", prompt),
      field("Negative prompt", negative),
      h("div", { class: "row" }, field("Width", width), field("Height", height), field("Steps", steps), field("Seed", seed)),
      h("div", { class: "form-actions" }, submit),
    );
    const showGallery = () => {
      clear(results).append(
        ...gallery.map((item) =>
          h(
            "figure",
            { class: "card image" },
            h("img", { src: item.url, alt: item.caption, width: item.width, height: item.height }),
            h("figcaption", {}, h("span", { text: item.caption }), h("a", { class: "button ghost", href: item.url, download: item.name, text: "Download PNG" })),
          ),
        ),
      );
    };

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {
        model: model.value,
        prompt: prompt.value,
        size: `${width.value}x${height.value}`,
        num_inference_steps: Number(steps.value),
        n: 1,
        response_format: "b64_json",
      };
      if (negative.value.trim()) body.negative_prompt = negative.value.trim();
      if (seed.value !== "") body.seed = Number(seed.value);
      submit.disabled = true;
      const started = performance.now();
      clear(status).append(notice("info", "Generating… (the first image also loads the model)"));
      try {
        const answer = await postJSON("/engines/v1/images/generations", body);
        const took = (performance.now() - started) / 1000;
        for (const item of answer.data) {
          const raw = atob(item.b64_json);
          const data = new Uint8Array(raw.length);
          for (let i = 0; i < raw.length; i += 1) data[i] = raw.charCodeAt(i);
          const url = URL.createObjectURL(new Blob([data], { type: "image/png" }));
          const slug = prompt.value.trim().toLowerCase().replace(/[^a-z0-9]+/g, "-").slice(0, 40) || "image";
          const caption = `${prompt.value.trim()} — ${body.size}, ${body.num_inference_steps} steps${body.seed !== undefined ? `, seed ${body.seed}` : ""}`;
          gallery.unshift({ url, name: `${slug}-${body.seed ?? Date.now()}.png`, caption, width: Number(width.value), height: Number(height.value) });
        }
        clear(status).append(notice("ok", `Done in ${seconds(took)}`));
        showGallery();
      } catch (error) {
        clear(status).append(notice("error", error.message));
      } finally {
        submit.disabled = false;
      }
    });

    root.append(h("div", { class: "page-head" }, h("h1", { text: "Images" })), form, status, results);
    showGallery();
    listModels()
      .then((all) => {
        const images = all.filter(isImageModel);
        model.replaceChildren(...images.map((m) => h("option", { value: m.tags[0] || m.id, text: modelName(m) })));
        if (!images.length) {
          status.append(notice("info", "No image model (DDUF) in the store: package one with `model package --dduf FILE NAME`."));
          submit.disabled = true;
        }
      })
      .catch((error) => status.append(notice("error", error.message)));
  },
};
