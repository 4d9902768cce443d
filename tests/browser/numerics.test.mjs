// The numerics of issue 17 on the dashboard, in a real browser: Debian's Chromium driven by
// playwright-core against the real prismd of the build holding the job of
// tests/integration/test_numerics_surfaces.py (numerics_feed.py). The block map's "Low formats
// and numerics" table lists each block's format with its colour (int4, fp8_e4m3 and int8 distinct),
// reason, candidate, hold and SAT / UNDER; the block view shows the same; the charts count low
// blocks per format from blocks_by_precision. Run by ctest as test_browser_numerics
// (tests/numerics_surfaces.cmake) or by hand:
//   PRISM_BUILD_DIR=build node --test tests/browser/numerics.test.mjs
// Every wait is bounded; screenshots go to $PRISM_BUILD_DIR/browser-screenshots/numerics*.png.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { BUILD, SRC, launchBrowser, viewReady, watchProblems } from './harness.mjs';

const SHOTS = path.join(BUILD, 'browser-screenshots');
const WAIT = 60000;

/** numerics_feed.py's handle once it printed its ready line. */
function startNumericsFeed(timeoutMs = 120000) {
  const proc = spawn('/usr/bin/python3', [path.join(SRC, 'tests', 'browser', 'numerics_feed.py')],
    { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, PRISM_BUILD_DIR: BUILD } });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => { proc.kill('SIGTERM'); reject(new Error(`numerics_feed.py not ready:\n${stderr}`)); }, timeoutMs);
    proc.stdout.on('data', (d) => {
      out += d;
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        resolve({ proc, ready: JSON.parse(out.slice(0, nl)) });
      }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`numerics_feed.py exited (${code}):\n${stderr}`)); });
  });
}

let feed;
let browser;

describe('the numerics of issue 17 on the dashboard', { timeout: 600000 }, () => {
  before(async () => {
    feed = await startNumericsFeed();
    browser = await launchBrowser();
  });
  after(async () => {
    if (browser) await browser.close();
    if (feed) {
      const ended = new Promise((resolve) => feed.proc.once('exit', resolve));
      feed.proc.stdin.end();
      const t = setTimeout(() => feed.proc.kill('SIGKILL'), 30000);
      await ended;
      clearTimeout(t);
    }
  });

  it('the block map lists formats with their colours, reasons, holds and figures', async () => {
    const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
    const page = await context.newPage();
    const watch = watchProblems(page);
    const base = `http://${feed.ready.http}/`;
    await page.goto(`${base}#/jobs/${feed.ready.job}`);
    await viewReady(page, 'map', WAIT, watch);
    await page.waitForSelector('#numerics-table tbody tr', { timeout: WAIT });
    const rows = await page.$$eval('#numerics-table tbody tr', (trs) => trs.map((tr) => ({
      block: tr.dataset.block,
      cells: [...tr.children].map((c) => c.textContent.trim()),
      swatch: getComputedStyle(tr.querySelector('td.format .swatch')).backgroundColor,
    })));
    const heads = await page.$$eval('#numerics-table thead th', (ths) => ths.map((th) => th.textContent.trim()));
    assert.deepEqual(heads, ['block', 'format', 'reason', 'candidate', 'held until', 'sat', 'under']);
    // The most saturated first (3, 1, 2), then the held block without figures (4); block 0 (bf16,
    // never moved, no figures) is not listed.
    assert.deepEqual(rows.map((r) => [r.block, ...r.cells]), [
      ['3', 'layer.3', 'bf16', 'saturation', 'int8', '—', '75.0000 %', '0.0000 %'],
      ['1', 'layer.1', 'int4', 'score', 'int4', '—', '25.0000 %', '12.5000 %'],
      ['2', 'layer.2', 'fp8_e4m3', 'score', 'fp8_e4m3', '—', '12.5000 %', '37.5000 %'],
      ['4', 'layer.4', 'bf16', 'loss_spike', 'int8', '15', '—', '—'],
    ]);
    // Okabe-Ito: int4 yellow, fp8_e4m3 bluish green, bf16 sky blue (palette.ts).
    assert.deepEqual(rows.map((r) => r.swatch), ['rgb(86, 180, 233)', 'rgb(240, 228, 66)', 'rgb(0, 158, 115)', 'rgb(86, 180, 233)']);
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, 'numerics.png'), fullPage: true });

    await page.evaluate((h) => { window.location.hash = h; }, `#/jobs/${feed.ready.job}/blocks/1`);
    await viewReady(page, 'block', WAIT, watch);
    const facts = await page.$$eval('dl dt', (dts) => dts.map((dt) => [dt.textContent.trim(), dt.nextElementSibling.textContent.trim()]));
    const byKey = Object.fromEntries(facts);
    assert.equal(byKey['candidate format'], 'int4');
    assert.equal(byKey['saturated'], '25.0000 %');
    assert.equal(byKey['underflowed'], '12.5000 %');
    await page.screenshot({ path: path.join(SHOTS, 'numerics-block.png'), fullPage: true });

    // The charts count blocks per format from each record's blocks_by_precision (steps 2 and 4:
    // 2 bf16, 1 each of int4, fp8_e4m3, int8; step 5: 3 bf16, 1 int4, 1 fp8_e4m3): never "auto".
    await page.evaluate((h) => { window.location.hash = h; }, `#/jobs/${feed.ready.job}/charts`);
    await viewReady(page, 'charts', WAIT, watch);
    await page.waitForFunction(() => {
      const n = document.querySelector('[data-chart="precisions"] .note');
      return n && n.textContent.trim() !== '';
    }, null, { timeout: WAIT });
    const note = await page.$eval('[data-chart="precisions"] .note', (n) => n.textContent.trim());
    assert.equal(note, 'bf16, fp8_e4m3, int8, int4');
    await page.screenshot({ path: path.join(SHOTS, 'numerics-charts.png'), fullPage: true });
    assert.deepEqual(watch.problems, []);
    await context.close();
  });
});
