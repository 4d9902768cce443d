// What the dashboard costs (issue 13 item 4; not run in CI). Against the real prismd of a build,
// fed by tests/browser/feed.py with maps that change at every decision (one decision a second):
//   1. the gzipped size of every file prismd serves for the dashboard (each file of
//      BUILD/web/dist, fetched from prismd with Accept-Encoding: gzip: the bytes on the wire);
//   2. in headless Chromium, the time to first render of a job's block map (navigation start to
//      #view[data-view=map][data-ready=true], in page time) for 1,000 and 10,000 blocks,
//      median of --loads fresh loads each;
//   3. the page's CPU time per live update at one update a second: Chromium's TaskDuration and
//      ScriptDuration (CDP Performance.getMetrics) over --updates map events, divided by them.
// Usage: PRISM_BUILD_DIR=build-rel node bench/bench_dashboard.mjs [--loads 5] [--updates 30]
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import zlib from 'node:zlib';
import { BUILD, instrument, launchBrowser, request, startFeed, stopFeed } from '../tests/browser/harness.mjs';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const LOADS = arg('loads', 5);
const UPDATES = arg('updates', 30);
const WAIT = 120000;
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor((s.length - 1) / 2)]; };

/** Every file of BUILD/web/dist with its raw size, gzip -9 size and the bytes prismd sends. */
async function sizes(base) {
  const dist = path.join(BUILD, 'web', 'dist');
  const files = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else files.push(path.relative(dist, p));
    }
  };
  walk(dist);
  const rows = [];
  for (const f of files.sort()) {
    const raw = fs.readFileSync(path.join(dist, f));
    const url = `${base}${f === 'index.html' ? '' : f.split(path.sep).join('/')}`;
    const r = await request(url, { headers: { 'accept-encoding': 'gzip' } });
    if (r.status !== 200) throw new Error(`GET ${url}: ${r.status}`);
    rows.push({ file: f, raw: raw.length, gzip9: zlib.gzipSync(raw, { level: 9 }).length,
      served: r.body.length, encoding: r.headers['content-encoding'] || 'identity' });
  }
  return rows;
}

/** Median time to first render of job's map over LOADS fresh pages (fresh contexts: no cache). */
async function firstRender(browser, base, job, blocks) {
  const times = [];
  for (let i = 0; i < LOADS; i++) {
    const context = await browser.newContext({ viewport: { width: 1600, height: 1000 } });
    const page = await context.newPage();
    await page.addInitScript(() => {
      // performance.now() counts from navigation start; note the first moment the map is ready.
      new MutationObserver(() => {
        const v = document.getElementById('view');
        if (v && v.dataset.view === 'map' && v.dataset.ready === 'true' && !window.__readyAt)
          window.__readyAt = performance.now();
      }).observe(document, { subtree: true, attributes: true, childList: true });
    });
    await page.goto(`${base}#/jobs/${job}`);
    await page.waitForSelector(`#block-map[data-blocks="${blocks}"]`, { timeout: WAIT, state: 'attached' });
    await page.waitForFunction(() => window.__readyAt, null, { timeout: WAIT });
    times.push(await page.evaluate(() => window.__readyAt));
    await context.close();
  }
  return { median: median(times), all: times };
}

/** The page's main-thread CPU per map update while job's map view is open, over UPDATES events. */
async function cpuPerUpdate(browser, base, job) {
  const context = await browser.newContext({ viewport: { width: 1600, height: 1000 } });
  const page = await context.newPage();
  await instrument(page);
  await page.goto(`${base}#/jobs/${job}`);
  await page.waitForSelector('#view[data-view="map"][data-ready="true"]', { timeout: WAIT });
  const cdp = await context.newCDPSession(page);
  // threadTicks: the durations are the main thread's CPU time, not wall time.
  await cdp.send('Performance.enable', { timeDomain: 'threadTicks' });
  const metrics = async () => Object.fromEntries((await cdp.send('Performance.getMetrics')).metrics.map((m) => [m.name, m.value]));
  // Start at an event, so the interval holds whole update periods.
  const n0 = await page.evaluate(() => window.__prismMapEvents.length);
  await page.waitForFunction((n) => window.__prismMapEvents.length > n, n0, { timeout: WAIT });
  const m0 = await metrics();
  const w0 = Date.now();
  const e0 = await page.evaluate(() => window.__prismMapEvents.length);
  await page.waitForFunction((n) => window.__prismMapEvents.length >= n, e0 + UPDATES, { timeout: WAIT + UPDATES * 5000 });
  const m1 = await metrics();
  const w1 = Date.now();
  const e1 = await page.evaluate(() => window.__prismMapEvents.length);
  const updates = e1 - e0;
  const seconds = (w1 - w0) / 1000;
  await context.close();
  return {
    updates, seconds, rate: updates / seconds,
    taskMs: (1000 * (m1.TaskDuration - m0.TaskDuration)) / updates,
    scriptMs: (1000 * (m1.ScriptDuration - m0.ScriptDuration)) / updates,
    layoutMs: (1000 * ((m1.LayoutDuration - m0.LayoutDuration) + (m1.RecalcStyleDuration - m0.RecalcStyleDuration))) / updates,
  };
}

const feed = await startFeed(['--jobs', '1k,10k', '--churn', '1k,10k', '--big-step-ms', '200', '--seconds', '1200']);
let browser;
try {
  const { base, jobs } = feed.ready;
  const files = await sizes(base);
  browser = await launchBrowser();
  const version = browser.version();
  const ttfr = {};
  const cpu = {};
  for (const [kind, blocks] of [['1k', 1000], ['10k', 10000]]) {
    ttfr[kind] = await firstRender(browser, base, jobs[kind], blocks);
    cpu[kind] = await cpuPerUpdate(browser, base, jobs[kind]);
  }
  const kb = (b) => (b / 1024).toFixed(1);
  console.log(`machine: ${os.cpus().length} x ${os.cpus()[0].model}, load average ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}; Chromium ${version}; Node ${process.version}`);
  console.log('\n| file | raw | gzip -9 | served (gzip) |\n| --- | ---: | ---: | ---: |');
  for (const f of files) console.log(`| ${f.file} | ${kb(f.raw)} KB | ${kb(f.gzip9)} KB | ${kb(f.served)} KB (${f.encoding}) |`);
  const sum = (k) => files.reduce((s, f) => s + f[k], 0);
  console.log(`| **all** | ${kb(sum('raw'))} KB | ${kb(sum('gzip9'))} KB | ${kb(sum('served'))} KB |`);
  console.log(`\n| job | first render, median of ${LOADS} (all, ms) | CPU per update: task / script / style+layout (ms) | updates, rate |\n| --- | ---: | ---: | ---: |`);
  for (const kind of ['1k', '10k']) {
    const t = ttfr[kind];
    const c = cpu[kind];
    console.log(`| ${kind === '1k' ? '1,000' : '10,000'} blocks | ${t.median.toFixed(0)} (${t.all.map((x) => x.toFixed(0)).join(', ')}) | ` +
      `${c.taskMs.toFixed(1)} / ${c.scriptMs.toFixed(1)} / ${c.layoutMs.toFixed(1)} | ${c.updates} in ${c.seconds.toFixed(1)} s (${c.rate.toFixed(2)}/s) |`);
  }
  console.log(`\n${JSON.stringify({ files, ttfr, cpu })}`);
} finally {
  if (browser) await browser.close();
  await stopFeed(feed);
}
