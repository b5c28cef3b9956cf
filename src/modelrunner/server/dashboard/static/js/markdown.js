// A small Markdown renderer that builds DOM nodes: model text only ever becomes text nodes, links only
// http(s) links. Covers what chat answers use: fenced code, headings, lists, quotes, rules, paragraphs,
// inline code, bold, italics and links. An unfinished fence (mid-stream) renders as code so far.

import { h } from "./dom.js";

export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) root.append(h("p", {}, inline(paragraph.join("\n"))));
    paragraph = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      root.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      root.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      root.append(h("hr"));
      i += 1;
      continue;
    }
    const item = line.match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[2]);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const next = lines[i].match(/^(\s*)([-*+]|\d+[.)])\s+(.*)$/);
        if (!next || /\d/.test(next[2]) !== ordered) break;
        list.append(h("li", {}, inline(next[3])));
        i += 1;
      }
      root.append(list);
      continue;
    }
    if (line.startsWith(">")) {
      flush();
      const quoted = [];
      while (i < lines.length && lines[i].startsWith(">")) quoted.push(lines[i++].replace(/^>\s?/, ""));
      root.append(h("blockquote", {}, renderMarkdown(quoted.join("\n"))));
      continue;
    }
    if (!line.trim()) flush();
    else paragraph.push(line);
    i += 1;
  }
  flush();
  return root;
}

function codeBlock(code, language) {
  const copy = h("button", { type: "button", class: "ghost copy", text: "Copy" });
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => {
      copy.textContent = "Copied";
      setTimeout(() => (copy.textContent = "Copy"), 1500);
    });
  });
  return h(
    "div",
    { class: "code" },
    h("div", { class: "code-head" }, h("span", { text: language || "code" }), copy),
    h("pre", {}, h("code", { text: code })),
  );
}

const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\(([^)\s]+)\)/g;

function inline(text) {
  const out = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) out.push(breaks(text.slice(last, match.index)));
    if (match[1]) out.push(h("code", { text: match[2].trim() }));
    else if (match[3] || match[4]) out.push(h("strong", {}, inline(match[3] || match[4])));
    else if (match[5] || match[6]) out.push(h("em", {}, inline(match[5] || match[6])));
    else out.push(link(match[7], match[8]));
    last = match.index + match[0].length;
  }
  if (last < text.length) out.push(breaks(text.slice(last)));
  return out;
}

function breaks(text) {
  const parts = text.split("\n");
  return parts.flatMap((part, i) => (i ? [h("br"), part] : [part]));
}

function link(label, href) {
  let url;
  try {
    url = new URL(href);
  } catch {
    return `[${label}](${href})`;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return `[${label}](${href})`;
  return h("a", { href: url.href, target: "_blank", rel: "noopener noreferrer nofollow", text: label });
}
