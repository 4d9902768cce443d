import assert from "node:assert/strict";
import { test } from "node:test";
import { parseSse } from "../src/sse";

const map = 'event: map\nid: 5\ndata: {"job_id":"j","map_version":5}\n\n';

test("a map event as prismd writes it", () => {
  assert.deepEqual(parseSse(map), { events: [{ event: "map", data: '{"job_id":"j","map_version":5}', id: "5" }], rest: "" });
});

test("an event cut between chunks comes out once it ends", () => {
  const first = parseSse(map.slice(0, 20));
  assert.deepEqual(first, { events: [], rest: map.slice(0, 20) });
  const second = parseSse(first.rest + map.slice(20) + "event: deleted\ndata: {}");
  assert.equal(second.events.length, 1);
  assert.equal(second.events[0]!.id, "5");
  assert.equal(second.rest, "event: deleted\ndata: {}");
});

test("keep-alive comments, CRLF, several data lines, an event with no type", () => {
  const r = parseSse(': keep-alive\n\r\ndata: a\r\ndata: b\r\n\r\nevent: deleted\ndata: {"job_id":"j"}\n\n');
  assert.deepEqual(r.events, [
    { event: "message", data: "a\nb", id: null },
    { event: "deleted", data: '{"job_id":"j"}', id: null },
  ]);
  assert.equal(r.rest, "");
});

test("a decision event (no id: the map version did not change)", () => {
  const r = parseSse('event: decision\ndata: {"job_id":"j","step":340,"map_version":5}\n\n');
  assert.deepEqual(r, { events: [{ event: "decision", data: '{"job_id":"j","step":340,"map_version":5}', id: null }], rest: "" });
});
