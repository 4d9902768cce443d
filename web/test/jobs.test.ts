import assert from "node:assert/strict";
import { test } from "node:test";
import { lastDecisionText } from "../src/views/jobs";

const NOW = Date.UTC(2026, 10, 26, 10, 0, 0);

test("the jobs view's last decision: the time since it and its step", () => {
  const now = NOW / 1000;
  assert.equal(lastDecisionText(340, now - 12.4, now), "12 s (step 340)");
  assert.equal(lastDecisionText(12000, now - 185, now), "3 min 05 s (step 12,000)");
  assert.equal(lastDecisionText(340, now + 2, now), "0 s (step 340)", "prismd's clock ahead of the page's");
  assert.equal(lastDecisionText(340, null, now), "step 340", "restored: no time known");
  assert.equal(lastDecisionText(null, null, now), "—", "no decision yet");
});
