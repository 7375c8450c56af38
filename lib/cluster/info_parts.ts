import type { BusConnection } from "./nats_connection.ts";
import { decodeMessage, encodeMessage, InfoPart, InfoReply } from "./messages.ts";
import { subjects } from "./subjects.ts";

/** Room left in a message for the part's envelope (type, ids, counts) around its data. */
const ENVELOPE_BYTES = 1024;
/** Parts are kept well under the limit: one large message holds the bus up for everyone. */
const MAX_PART_BYTES = 256 * 1024;

/**
 * Splits an encoded info reply into the raw byte ranges of its parts, sized so that each part,
 * base64-encoded in its envelope, fits in `maxPayload` (the server's limit).
 */
export function infoPartRanges(total: number, maxPayload: number): Array<[number, number]> {
  const room = Math.floor(((maxPayload - ENVELOPE_BYTES) * 3) / 4);
  const size = Math.max(1024, Math.min(MAX_PART_BYTES, room - (room % 3)));
  const out: Array<[number, number]> = [];
  for (let at = 0; at < total || out.length === 0; at += size) {
    out.push([at, Math.min(total, at + size)]);
  }
  return out;
}

export function toBase64(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin);
}

export function fromBase64(text: string): Uint8Array {
  const bin = atob(text);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * Asks `replica` for its info reply part by part and reassembles it. Throws with what was
 * wrong (a timeout, a malformed or inconsistent part, a malformed whole).
 */
export async function requestInfo(
  nc: BusConnection,
  replica: string,
  timeoutMs: number,
  /** For a replica serving several models: whose facts (it loads the model to give them). */
  model?: string,
): Promise<InfoReply> {
  const chunks: Uint8Array[] = [];
  let parts = 1;
  let bytes = 0;
  for (let part = 0; part < parts; part++) {
    const reply = await nc.request(
      subjects.requests(replica),
      encodeMessage({ type: "info", part, ...(model === undefined ? {} : { model }) }),
      { timeout: timeoutMs },
    );
    const p = decodeMessage(InfoPart, reply.data);
    if (!p.ok) throw new Error(`malformed info part ${part}: ${p.error}`);
    if (part === 0) {
      parts = p.value.parts;
      bytes = p.value.bytes;
    } else if (p.value.parts !== parts || p.value.bytes !== bytes || p.value.part !== part) {
      throw new Error(
        `info part ${part} does not match part 0 (received part ${p.value.part} of ` +
          `${p.value.parts}, ${p.value.bytes} bytes; expected ${parts} parts, ${bytes} bytes)`,
      );
    }
    chunks.push(fromBase64(p.value.data));
  }
  const whole = new Uint8Array(bytes);
  let at = 0;
  for (const c of chunks) {
    if (at + c.length > bytes) break;
    whole.set(c, at);
    at += c.length;
  }
  if (at !== bytes || chunks.reduce((n, c) => n + c.length, 0) !== bytes) {
    throw new Error(
      `info parts hold ${chunks.reduce((n, c) => n + c.length, 0)} bytes, ` +
        `announced ${bytes}`,
    );
  }
  const info = decodeMessage(InfoReply, whole);
  if (!info.ok) throw new Error(`malformed info reply: ${info.error}`);
  return info.value;
}
