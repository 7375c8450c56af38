/**
 * A WebSocket client over a bare TCP connection that completes the handshake and can send
 * frames, but reads nothing unless asked: the way to play a client that stopped reading
 * (browser and Deno WebSocket clients always drain the socket).
 */
export class RawWebSocket {
  private constructor(readonly conn: Deno.TcpConn) {}

  static async connect(url: string): Promise<RawWebSocket> {
    const u = new URL(url);
    const conn = await Deno.connect({ hostname: u.hostname, port: Number(u.port) });
    const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
    const head = `GET ${u.pathname}${u.search} HTTP/1.1\r\nHost: ${u.host}\r\n` +
      `Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ${key}\r\n` +
      `Sec-WebSocket-Version: 13\r\n\r\n`;
    await writeAll(conn, new TextEncoder().encode(head));
    // Read the response head only; the server sends no frames before we ask for some.
    let got = "";
    const buf = new Uint8Array(1);
    while (!got.endsWith("\r\n\r\n")) {
      const n = await conn.read(buf);
      if (n === null) {
        throw new Error(`Server closed during the handshake; got ${JSON.stringify(got)}`);
      }
      got += String.fromCharCode(buf[0]!);
    }
    if (!got.startsWith("HTTP/1.1 101")) {
      conn.close();
      throw new Error(`WebSocket handshake refused: ${got.split("\r\n")[0]}`);
    }
    return new RawWebSocket(conn);
  }

  /** Sends one masked text frame (clients must mask, RFC 6455 §5.3). */
  async sendText(text: string): Promise<void> {
    await writeAll(this.conn, maskedFrame(0x1, new TextEncoder().encode(text)));
  }

  /**
   * Announces a text frame of `bytes` and streams its payload (1 MiB writes) until the server
   * closes the connection or all is sent; returns the close code the server sent, if any, and
   * how much of the payload went out.
   */
  async sendHugeFrame(bytes: number): Promise<{ closeCode?: number; sent: number }> {
    const head = new Uint8Array(14);
    head[0] = 0x81;
    head[1] = 0x80 | 127;
    new DataView(head.buffer).setBigUint64(2, BigInt(bytes));
    head.set(crypto.getRandomValues(new Uint8Array(4)), 10);
    let closeCode: number | undefined;
    let ended = false;
    const reading = (async () => {
      const buf = new Uint8Array(64);
      const n = await this.conn.read(buf).catch(() => null);
      if (n !== null && n >= 4 && (buf[0]! & 0x0f) === 8) closeCode = (buf[2]! << 8) | buf[3]!;
      ended = true;
    })();
    let sent = 0;
    try {
      await writeAll(this.conn, head);
      const chunk = new Uint8Array(1 << 20).fill(0x61);
      while (sent < bytes && !ended) {
        const n = Math.min(chunk.byteLength, bytes - sent);
        await writeAll(this.conn, chunk.subarray(0, n));
        sent += n;
      }
    } catch {
      // The server closed the connection mid-payload: what a refusal looks like.
    }
    await reading;
    this.close();
    return closeCode === undefined ? { sent } : { closeCode, sent };
  }

  close(): void {
    try {
      this.conn.close();
    } catch {
      // already closed by the server
    }
  }
}

function maskedFrame(opcode: number, payload: Uint8Array): Uint8Array {
  const len = payload.byteLength;
  const ext = len < 126 ? 0 : len < 65536 ? 2 : 8;
  const out = new Uint8Array(2 + ext + 4 + len);
  out[0] = 0x80 | opcode;
  let at = 2;
  if (ext === 0) out[1] = 0x80 | len;
  else if (ext === 2) {
    out[1] = 0x80 | 126;
    new DataView(out.buffer).setUint16(2, len);
    at = 4;
  } else {
    out[1] = 0x80 | 127;
    new DataView(out.buffer).setBigUint64(2, BigInt(len));
    at = 10;
  }
  const mask = crypto.getRandomValues(new Uint8Array(4));
  out.set(mask, at);
  at += 4;
  for (let i = 0; i < len; i++) out[at + i] = payload[i]! ^ mask[i % 4]!;
  return out;
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let off = 0;
  while (off < bytes.byteLength) off += await conn.write(bytes.subarray(off));
}
