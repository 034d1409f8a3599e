// The admin token and calls to the admin API and the OpenAI API.
const KEY = "tokenbus.admin-token";

// takeFragmentToken moves a #token=... fragment (the link tokenbus dev
// prints) into session storage and clears it from the address bar and the
// history, so that it is neither bookmarked nor shown.
export function takeFragmentToken() {
  const m = location.hash.match(/^#token=([^&]*)/);
  if (!m) return;
  const token = decodeURIComponent(m[1].replace(/\+/g, " "));
  if (token) sessionStorage.setItem(KEY, token);
  history.replaceState(null, "", location.pathname + location.search + "#/fleet");
}

export const token = () => sessionStorage.getItem(KEY) || "";
export const setToken = (t) => sessionStorage.setItem(KEY, t);
export const signOut = () => sessionStorage.removeItem(KEY);

// APIError is an error answer in OpenAI's shape.
export class APIError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error && body.error.code;
  }
}

let onUnauthorized = () => {};
export function whenUnauthorized(f) { onUnauthorized = f; }

// admin calls the admin API (same origin) with the token; JSON in and out.
export async function admin(path, {method = "GET", body, signal, raw = false} = {}) {
  const headers = {Authorization: "Bearer " + token()};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body)});
  if (r.status === 401) onUnauthorized();
  if (!r.ok) {
    let b = null;
    try { b = await r.json(); } catch (_) { /* not JSON */ }
    throw new APIError(r.status, b);
  }
  return raw ? r : r.json();
}

// events yields the data of each Server-Sent Event of a fetch response.
export async function* events(response) {
  const reader = response.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buf += dec.decode(value, {stream: true}).replace(/\r\n/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = ev.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

// apiBase is the OpenAI API's URL: its listen address, with this page's host
// name when it listens on every interface.
export function apiBase(addr) {
  const i = addr.lastIndexOf(":");
  let host = addr.slice(0, i);
  const port = addr.slice(i + 1);
  if (host === "" || host === "0.0.0.0" || host === "[::]" || host === "::") host = location.hostname.includes(":") ? `[${location.hostname}]` : location.hostname;
  return `${location.protocol}//${host}:${port}`;
}
