import assert from "node:assert/strict";
import { test } from "node:test";
import { RECONNECT_MAX_MS, RECONNECT_MS, nextTry, reconnectDelayMs } from "../src/live";

const NOW = Date.UTC(2026, 10, 26, 10, 0, 0);

test("the wait before a stream opens again: the larger of Retry-After and 5 s", () => {
  assert.equal(RECONNECT_MS, 5000);
  assert.equal(reconnectDelayMs(null, NOW), 5000, "no Retry-After");
  assert.equal(reconnectDelayMs("10", NOW), 10000, "prismd's 503 past the stream caps");
  assert.equal(reconnectDelayMs(" 7 ", NOW), 7000);
  assert.equal(reconnectDelayMs("2", NOW), 5000, "shorter than 5 s");
  assert.equal(reconnectDelayMs("0", NOW), 5000);
  assert.equal(reconnectDelayMs("Thu, 26 Nov 2026 10:00:30 GMT", NOW), 30000, "an HTTP date");
  assert.equal(reconnectDelayMs("Thu, 26 Nov 2026 09:59:00 GMT", NOW), 5000, "a date past");
  assert.equal(reconnectDelayMs("soon", NOW), 5000, "not a delay");
  assert.equal(reconnectDelayMs("-3", NOW), 5000);
  assert.equal(reconnectDelayMs("86400", NOW), RECONNECT_MAX_MS, "capped");
});

test("after a refusal: 503 waits for Retry-After, keeping the token choice", () => {
  assert.deepEqual(nextTry(503, "10", false, false, NOW), { kind: "retry", delayMs: 10000, withToken: false });
  assert.deepEqual(nextTry(503, "10", true, true, NOW), { kind: "retry", delayMs: 10000, withToken: true });
  assert.deepEqual(nextTry(500, null, false, true, NOW), { kind: "retry", delayMs: 5000, withToken: false });
});

test("after a stream that ended or a request that failed: again in 5 s", () => {
  assert.deepEqual(nextTry(200, null, false, false, NOW), { kind: "retry", delayMs: 5000, withToken: false });
  assert.deepEqual(nextTry(0, null, true, true, NOW), { kind: "retry", delayMs: 5000, withToken: true });
});

test("401: at once with the tab's token when it has one and it was not sent, else wait for one", () => {
  assert.deepEqual(nextTry(401, null, false, true, NOW), { kind: "retry", delayMs: 0, withToken: true });
  assert.deepEqual(nextTry(401, null, false, false, NOW), { kind: "refused" });
  assert.deepEqual(nextTry(401, null, true, true, NOW), { kind: "refused" }, "the token was refused");
  assert.deepEqual(nextTry(403, null, true, true, NOW), { kind: "refused" }, "another job's token");
});

test("404: the job is gone", () => {
  assert.deepEqual(nextTry(404, null, false, false, NOW), { kind: "deleted" });
});
