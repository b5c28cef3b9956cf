// The daemon's API, same origin. The API key lives in session storage (gone when the tab closes) and is sent
// as a bearer token, never in a URL.

const KEY = "modelrunner.apiKey";
const listeners = new Set();

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

// auth state: null (not known yet), "ok", or the daemon's message for a refused key
export function onAuth(listener) {
  listeners.add(listener);
}
function authState(state) {
  for (const listener of listeners) listener(state);
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// The message of an error body in any of the daemon's shapes (OpenAI/DMR, Ollama, Anthropic, FastAPI).
export async function errorMessage(response) {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    const error = body.error;
    if (error && typeof error === "object" && error.message) return String(error.message);
    if (typeof error === "string") return error;
    if (typeof body.message === "string") return body.message;
    if (Array.isArray(body.detail)) {
      return body.detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
    }
    if (typeof body.detail === "string") return body.detail;
  } catch {
    // not JSON
  }
  return text.trim() || `${response.status} ${response.statusText}`;
}

export async function request(path, { method = "GET", json, body, headers = {}, signal, accept } = {}) {
  const sent = new Headers(headers);
  const key = getKey();
  if (key) sent.set("Authorization", `Bearer ${key}`);
  if (json !== undefined) {
    sent.set("Content-Type", "application/json");
    body = JSON.stringify(json);
  }
  if (accept) sent.set("Accept", accept);
  let response;
  try {
    response = await fetch(path, { method, headers: sent, body, signal, cache: "no-store", credentials: "omit" });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, `The model runner cannot be reached (${error.message}). Is \`model serve\` running?`);
  }
  if (response.status === 401) {
    const message = await errorMessage(response);
    const hint = key
      ? "The API key was refused: check the key set in MODEL_RUNNER_API_KEY."
      : "This model runner needs an API key (MODEL_RUNNER_API_KEY): enter it above.";
    authState(`${hint} (${message})`);
    throw new ApiError(401, hint);
  }
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  authState("ok");
  return response;
}

// Answers can come out of order: one that comes after the answer to a newer ask of the same thing is stale
// and is not shown over it (an install's last look at the engines, overwritten by its first, left the engine
// "Not Installed"). `const ask = newestAnswers()` once; per request `const newest = ask()`, then
// `if (newest()) show(answer)`.
export function newestAnswers() {
  let asked = 0;
  return () => {
    const mine = ++asked;
    return () => mine === asked;
  };
}

export async function getJSON(path, options) {
  return (await request(path, options)).json();
}

export async function postJSON(path, json, options = {}) {
  const response = await request(path, { ...options, method: "POST", json });
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

// The lines of a streamed body as they arrive.
export async function* lines(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n")) >= 0) {
        yield buffered.slice(0, end).replace(/\r$/, "");
        buffered = buffered.slice(end + 1);
      }
    }
    buffered += decoder.decode();
    if (buffered) yield buffered;
  } finally {
    reader.releaseLock();
  }
}

// Newline-delimited JSON (pull and install progress).
export async function* jsonLines(response) {
  for await (const line of lines(response)) {
    if (!line.trim()) continue;
    try {
      yield JSON.parse(line);
    } catch {
      yield { type: "progress", message: line };
    }
  }
}

// Server-sent events as {event, data}; fetch, not EventSource, because EventSource cannot send the key.
export async function* sseEvents(response) {
  let event = "message";
  let data = [];
  for await (const line of lines(response)) {
    if (line === "") {
      if (data.length) yield { event, data: data.join("\n") };
      event = "message";
      data = [];
    } else if (line.startsWith("event:")) {
      event = line.slice(6).trim();
    } else if (line.startsWith("data:")) {
      data.push(line.slice(5).replace(/^ /, ""));
    } else if (line.startsWith("error:")) {
      yield { event: "error", data: line.slice(6).trim() };
    }
  }
  if (data.length) yield { event, data: data.join("\n") };
}

export function listModels() {
  return getJSON("/models");
}
