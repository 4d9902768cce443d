/* The server-sent events wire format (the part prismd uses): events are blocks of "field:
 * value" lines ended by an empty line; "data" lines join with "\n"; lines starting with ":"
 * are comments (prismd's keep-alives). For the stream read with fetch when reads need a token,
 * which an EventSource cannot send. */

export interface SseEvent {
  /** the event's type ("message" when it names none) */
  event: string;
  data: string;
  id: string | null;
}

/**
 * The complete events at the start of text, and the rest (an event not yet ended) to prepend
 * to the next chunk. Lines end in "\n" or "\r\n".
 */
export function parseSse(text: string): { events: SseEvent[]; rest: string } {
  const normal = text.replace(/\r\n/g, "\n");
  const blocks = normal.split("\n\n");
  const rest = blocks.pop() ?? "";
  const events: SseEvent[] = [];
  for (const block of blocks) {
    let event = "message";
    let id: string | null = null;
    const data: string[] = [];
    let any = false;
    for (const line of block.split("\n")) {
      if (line === "" || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
      else continue;
      any = true;
    }
    if (any && data.length) events.push({ event, data: data.join("\n"), id });
  }
  return { events, rest };
}
