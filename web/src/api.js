// The console's only way to the server: the public API, with the token
// kept in this tab's sessionStorage (never in a URL, never in a cookie,
// never on a sandbox's origin).

const KEY = 'sandboxd.token';

export const token = {
  get: () => sessionStorage.getItem(KEY) || '',
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

// ApiError carries the contract's error body: code, message, requestId.
export class ApiError extends Error {
  constructor(status, code, message, requestId) {
    super(message);
    this.status = status;
    this.code = code;
    this.requestId = requestId;
  }
}

let onUnauthenticated = () => {};
export function setUnauthenticatedHandler(f) { onUnauthenticated = f; }

async function errorOf(res) {
  let code = 'http_' + res.status, message = res.statusText || 'request failed', rid = res.headers.get('X-Request-Id') || '';
  try {
    const b = await res.json();
    if (b && b.error) {
      code = b.error.code || code;
      message = b.error.message || message;
      rid = b.error.requestId || rid;
    }
  } catch (_) { /* not JSON */ }
  return new ApiError(res.status, code, message, rid);
}

// A GET the server refused for now (429 over the client's fairness limits,
// or 503, with Retry-After) is sent again after the wait the server asks
// for, plus a little jitter, at most RETRIES times and for waits up to
// MAX_WAIT_MS (a person is waiting: a longer one is shown at once); then
// the refusal is thrown, with the server's message. Other methods are
// not retried here.
const RETRIES = 3;
const MAX_WAIT_MS = 10000;

// retryWait is how long to wait before sending a refused GET again, or -1.
export function retryWait(method, res, attempt) {
  if (method !== 'GET' || attempt >= RETRIES || (res.status !== 429 && res.status !== 503)) return -1;
  const v = (res.headers.get('Retry-After') || '').trim();
  let ms = -1;
  if (/^\d+$/.test(v)) ms = Number(v) * 1000;
  else if (v && !isNaN(Date.parse(v))) ms = Math.max(0, Date.parse(v) - Date.now());
  if (ms < 0 || ms > MAX_WAIT_MS) return -1;
  return ms + Math.random() * Math.max(ms / 5, 50);
}

// sleep waits ms, or until signal aborts (an AbortError).
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const abort = () => { clearTimeout(id); reject(new DOMException('The wait was aborted', 'AbortError')); };
    const id = setTimeout(() => { if (signal) signal.removeEventListener('abort', abort); resolve(); }, ms);
    if (signal) {
      if (signal.aborted) abort();
      else signal.addEventListener('abort', abort, { once: true });
    }
  });
}

// api calls path with the token; JSON in and out. A 401 signs the tab out.
export async function api(method, path, body, opts = {}) {
  const headers = { Authorization: 'Bearer ' + (opts.token || token.get()) };
  let payload;
  if (body !== undefined && !(body instanceof Blob) && !(body instanceof ArrayBuffer)) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  } else {
    payload = body;
  }
  let res;
  for (let attempt = 0; ; attempt++) {
    try {
      res = await fetch(path, { method, headers, body: payload, cache: 'no-store', credentials: 'omit', signal: opts.signal });
    } catch (e) {
      if (e.name === 'AbortError') throw e;
      throw new ApiError(0, 'network', 'The server did not answer (' + e.message + '). Is sandboxd running?', '');
    }
    const wait = res.ok ? -1 : retryWait(method, res, attempt);
    if (wait < 0) break;
    if (res.body) res.body.cancel().catch(() => {});
    await sleep(wait, opts.signal);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && !opts.token) onUnauthenticated(err);
    throw err;
  }
  if (opts.raw) return res;
  if (res.status === 204) return null;
  const ct = res.headers.get('Content-Type') || '';
  if (ct.includes('json')) return res.json();
  return res.text();
}

export const get = (p, o) => api('GET', p, undefined, o);
export const post = (p, b, o) => api('POST', p, b, o);
export const del = (p, o) => api('DELETE', p, undefined, o);

export const enc = encodeURIComponent;

// wsURL is the WebSocket URL of an API path on this origin.
export function wsURL(path) {
  return (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + path;
}

// openWS opens an API WebSocket authenticated by the bearer token in the
// subprotocol list (the server answers "sandboxd" and never echoes it).
export function openWS(path) {
  const ws = new WebSocket(wsURL(path), ['sandboxd', 'bearer.' + token.get()]);
  ws.binaryType = 'arraybuffer';
  return ws;
}

// upload PUTs a file with progress (fetch has no upload progress).
export function upload(path, file, onProgress) {
  return new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open('PUT', path);
    x.setRequestHeader('Authorization', 'Bearer ' + token.get());
    x.upload.onprogress = (e) => { if (e.lengthComputable) onProgress(e.loaded / e.total); };
    x.onload = () => {
      if (x.status >= 200 && x.status < 300) { onProgress(1); resolve(); return; }
      let code = 'http_' + x.status, message = x.statusText, rid = x.getResponseHeader('X-Request-Id') || '';
      try { const b = JSON.parse(x.responseText); code = b.error.code; message = b.error.message; rid = b.error.requestId || rid; } catch (_) { }
      const err = new ApiError(x.status, code, message, rid);
      if (x.status === 401) onUnauthenticated(err);
      reject(err);
    };
    x.onerror = () => reject(new ApiError(0, 'network', 'The upload was cut off.', ''));
    x.send(file);
  });
}

// download fetches a file with the token and saves it through a blob URL.
export async function download(path, name) {
  const res = await api('GET', path, undefined, { raw: true });
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// openPortal sends the browser to a session's portal (editor, notebook,
// display, browser) with a single-use ticket: the portal lives on its own
// origin and turns the ticket into a cookie there, so the token never
// reaches sandbox content.
export async function openPortal(sessionId, url) {
  // Opened now, while the click still counts (a popup opened after an
  // await may be blocked), and emptied at once: a browser copies this tab's
  // sessionStorage, the token, into a tab it opens with an opener.
  const w = window.open('', '_blank');
  if (w) {
    try { w.sessionStorage.clear(); } catch (_) { /* not ours to read: nothing was copied */ }
    w.opener = null;
  }
  try {
    const t = await post('/v1/sandbox/' + enc(sessionId) + '/tickets');
    const u = new URL(url);
    u.searchParams.set('ticket', t.ticket);
    if (w) w.location = u.toString(); else location.assign(u.toString());
  } catch (e) {
    if (w) w.close();
    throw e;
  }
}

// visible shows a name a sandbox chose as it is: control, bidirectional
// formatting (a right-to-left override makes "exe.png" of "gnp.exe") and
// invisible characters (zero-width, fillers) become \u escapes.
export function visible(name) {
  return String(name).replace(/[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\u3164\ufeff\uffa0]/g,
    (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

// Formatting.
export function bytes(n) {
  if (n == null) return '–';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + ' ' + u[i];
}

export function ago(t, now = Date.now()) {
  if (!t) return '–';
  const s = Math.max(0, Math.round((now - Date.parse(t)) / 1000));
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd';
}

export function credits(n) {
  if (n == null) return '–';
  return n.toFixed(n < 10 ? 3 : 1).replace(/\.?0+$/, '') || '0';
}
