import assert from "node:assert/strict";
import { test } from "node:test";
import { age, bytes, num, pct, si } from "../src/format";
import { coalescing } from "../src/live";

test("numbers, percentages, ages, bytes and rates as the page prints them", () => {
  assert.equal(num(1234.5, 1), "1,234.5");
  assert.equal(num(10000), "10,000");
  assert.equal(num(null), "—");
  assert.equal(pct(30.2), "30.2 %");
  assert.equal(pct(undefined), "—");
  assert.equal(age(0), "0 s");
  assert.equal(age(59.9), "59 s");
  assert.equal(age(65), "1 min 05 s");
  assert.equal(age(7800), "2 h 10 min");
  assert.equal(age(3 * 86400 + 4 * 3600 + 5), "3 d 4 h");
  assert.equal(age(-3), "0 s", "a clock a little behind prismd's");
  assert.equal(bytes(85899345920), "80.0 GiB");
  assert.equal(bytes(512), "512 B");
  assert.equal(si(9.0e14), "900 T");
  assert.equal(si(1.8e15), "1.8 P");
  assert.equal(si(2.5e10), "25 G");
});

test("coalescing: calls during a run cost one more run, not one each", async () => {
  let calls = 0;
  let release: () => void = () => {};
  const r = coalescing(async () => {
    calls++;
    if (calls === 1) await new Promise<void>((ok) => (release = ok));
  });
  const first = r.run();
  void r.run();
  void r.run();
  void r.run();
  release();
  await first;
  assert.equal(calls, 2);
  await r.run();
  assert.equal(calls, 3);
});
