// What the dashboard's browser tests and its benchmark share: feed.py (a real prismd fed by gRPC
// agents), Chromium through playwright-core, HTTP(S) requests to prismd, a page's problems
// (console errors, page errors, failed requests, error answers) and a path-prefix proxy.
// Node 18 and 20; every wait is bounded.
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const BUILD = path.resolve(process.env.PRISM_BUILD_DIR || path.join(SRC, 'build'));
const webRequire = createRequire(path.join(SRC, 'web', 'package.json'));
export const { chromium } = webRequire('playwright-core');
export const AXE_PATH = webRequire.resolve('axe-core/axe.min.js');
export const CHROMIUM = process.env.PRISM_CHROMIUM || '/usr/bin/chromium';

/** Starts tests/browser/feed.py with args and resolves to {proc, ready} once it printed its
 * ready line (ready: the parsed JSON); rejects when it exits first or after timeoutMs. */
export function startFeed(args = [], timeoutMs = 180000) {
  const proc = spawn('/usr/bin/python3', [path.join(SRC, 'tests', 'browser', 'feed.py'), '--build', BUILD, ...args],
    { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; if (process.env.PRISM_FEED_LOG) process.stderr.write(d); });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => { proc.kill('SIGTERM'); reject(new Error(`feed.py not ready in ${timeoutMs} ms:\n${stderr}`)); }, timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        const ready = JSON.parse(out.slice(0, nl));
        ready.base = `${ready.scheme}://${ready.http}/`;
        resolve({ proc, ready, stderr: () => stderr });
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`feed.py exited (${code}) before ready:\n${stderr}`)); });
  });
}

/** Stops a feed (SIGTERM; it stops its prismd) and waits for its end, bounded; SIGKILL after. */
export async function stopFeed(feed) {
  if (!feed || feed.proc.exitCode !== null) return;
  const ended = new Promise((resolve) => feed.proc.once('exit', resolve));
  feed.proc.kill('SIGTERM');
  const t = setTimeout(() => feed.proc.kill('SIGKILL'), 30000);
  await ended;
  clearTimeout(t);
}

/** Chromium, headless, as the tests and benchmark run it. */
export function launchBrowser() {
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
}

/** One HTTP(S) request: resolves to {status, headers, body} (body a string). TLS certificates are
 * not checked (the tests' throwaway self-signed ones). */
export function request(url, { method = 'GET', body, token, headers = {} } = {}) {
  const u = new URL(url);
  const mod = u.protocol === 'https:' ? https : http;
  const h = { ...headers };
  if (token) h.authorization = `Bearer ${token}`;
  if (body !== undefined) h['content-type'] = 'application/json';
  return new Promise((resolve, reject) => {
    const req = mod.request(u, { method, headers: h, rejectUnauthorized: false, timeout: 30000 }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: no answer in 30 s`)));
    req.on('error', reject);
    if (body !== undefined) req.write(typeof body === 'string' ? body : JSON.stringify(body));
    req.end();
  }).then((r) => ({ ...r, text: r.body.toString('utf8') }));
}

/** GET url as JSON until ready(doc) holds, every 100 ms for at most timeoutMs; returns the doc. */
export async function jsonUntil(url, ready, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  for (let i = 0; i < timeoutMs / 100 + 1; i++) {
    const r = await request(url);
    last = r.text;
    if (r.status === 200) {
      const doc = JSON.parse(r.text);
      if (ready(doc)) return doc;
    }
    if (Date.now() > deadline) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error(`${url} never became ready in ${timeoutMs} ms; last answer: ${last.slice(0, 400)}`);
}

/** Watches a page for problems: console errors, uncaught page errors, failed requests and
 * answers >= 400. expect(method, urlPart, status) marks an error answer the test provokes (and
 * the console line Chromium writes for it) as expected. A request the page aborts itself (an
 * EventSource closed when the view changes, a fetch cut short by a newer one) is not a failure;
 * everything else is. */
export function watchProblems(page) {
  const problems = [];
  const expected = [];
  const isExpected = (method, url, status) =>
    expected.some((e) => (!e.method || !method || e.method === method) && url.includes(e.urlPart) && (!e.status || e.status === status));
  page.on('console', (msg) => {
    if (msg.type() !== 'error') return;
    const text = msg.text();
    const loc = msg.location();
    const m = /the server responded with a status of (\d+)/.exec(text);
    if (m && loc && loc.url && isExpected(null, loc.url, Number(m[1]))) return;
    problems.push(`console error: ${text}${loc && loc.url ? ` (${loc.url}:${loc.lineNumber})` : ''}`);
  });
  page.on('pageerror', (err) => problems.push(`page error: ${err.message}`));
  page.on('requestfailed', (req) => {
    const f = req.failure();
    if (f && f.errorText === 'net::ERR_ABORTED') return; // cancelled by the page (or its close)
    problems.push(`request failed: ${req.method()} ${req.url()}: ${f ? f.errorText : '?'}`);
  });
  page.on('response', (res) => {
    if (res.status() >= 400 && !isExpected(res.request().method(), res.url(), res.status()))
      problems.push(`error answer: ${res.request().method()} ${res.url()} -> ${res.status()}`);
  });
  return {
    problems,
    expect(method, urlPart, status) { expected.push({ method, urlPart, status }); },
  };
}

/** Before any script of the page runs: records, in page time (performance.now()), every `map`
 * event any EventSource receives (window.__prismMapEvents: {t, url, data}) and every fetch and
 * XMLHttpRequest the page starts (window.__prismFetches: {t, url, method}), and marks the
 * document (window.__prismLoadMark) so that a reload shows. Listeners added in the constructor
 * run before the app's own, so t is the arrival, not the app's reaction. */
export async function instrument(page) {
  return page.addInitScript(() => {
    window.__prismMapEvents = [];
    window.__prismFetches = [];
    window.__prismLoadMark = Math.random();
    const OrigES = window.EventSource;
    window.EventSource = class extends OrigES {
      constructor(url, opts) {
        super(url, opts);
        this.addEventListener('map', (e) => {
          window.__prismMapEvents.push({ t: performance.now(), url: String(url), data: JSON.parse(e.data) });
        });
      }
    };
    const origFetch = window.fetch;
    window.fetch = function (input, init) {
      const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
      const method = (init && init.method) || (input && input.method) || 'GET';
      window.__prismFetches.push({ t: performance.now(), url: new URL(url, document.baseURI).href, method });
      return origFetch.apply(this, arguments);
    };
    const origOpen = XMLHttpRequest.prototype.open;
    XMLHttpRequest.prototype.open = function (method, url) {
      window.__prismFetches.push({ t: performance.now(), url: new URL(url, document.baseURI).href, method });
      return origOpen.apply(this, arguments);
    };
  });
}

/** A reverse proxy on 127.0.0.1 that serves target under prefix (e.g. "/prism"): it strips the
 * prefix, forwards method, headers and body, and streams answers back as they come (event
 * streams included). Anything outside the prefix gets 404, so a page that asks for an absolute
 * path shows it. Resolves to {url, close}. */
export function prefixProxy(target, prefix) {
  const t = new URL(target);
  const server = http.createServer((req, res) => {
    if (req.url === prefix) {
      res.writeHead(301, { location: `${prefix}/` });
      res.end();
      return;
    }
    if (!req.url.startsWith(`${prefix}/`)) {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end(`not under ${prefix}/: ${req.url}\n`);
      return;
    }
    const headers = { ...req.headers, host: t.host };
    const up = http.request({ host: t.hostname, port: t.port, method: req.method, path: req.url.slice(prefix.length), headers }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      res.flushHeaders();
      ur.pipe(res);
    });
    up.on('error', (e) => { if (!res.headersSent) res.writeHead(502); res.end(String(e)); });
    // The browser went away (an EventSource closed): end the upstream request too.
    res.on('close', () => up.destroy());
    req.pipe(up);
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        url: `http://127.0.0.1:${port}${prefix}/`,
        close: () => new Promise((r) => { server.closeAllConnections?.(); server.close(() => r()); }),
      });
    });
  });
}

/** Waits until the view `name` has drawn its first data (#view[data-view=name][data-ready=true]);
 * when it does not, the error says what the page showed and the problems seen so far. */
export async function viewReady(page, name, timeout = 60000, watch = null) {
  try {
    await page.waitForSelector(`#view[data-view="${name}"][data-ready="true"]`, { timeout });
  } catch (e) {
    const shown = await page.evaluate(() => {
      const v = document.getElementById('view');
      return v ? `#view data-view=${v.dataset.view} data-ready=${v.dataset.ready}: ${v.textContent.slice(0, 300)}` : document.body.textContent.slice(0, 300);
    }).catch(() => '?');
    throw new Error(`the ${name} view never became ready (${e.message.split('\n')[0]}); the page shows ${shown}` +
      (watch && watch.problems.length ? `; problems: ${watch.problems.join(' | ')}` : ''));
  }
}
