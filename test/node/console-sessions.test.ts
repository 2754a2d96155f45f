// The site agent's console sessions (agent/roles/console.ts): one connection per machine, read
// from where each reader left off, a reader that fell behind told how much it missed, a dropped
// connection reported once and then reopened; and the Telnet reader a Redfish BMC's console is
// read with (negotiation refused and kept out of the bytes). Real TCP on loopback.
import net, { type AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { ConsoleSessions, telnetConsole, type ConsoleStream } from "../../agent/roles/console.ts";

const servers: net.Server[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.close();
});

/** A Telnet console server: each connection gets `greet`, and what it receives is kept. */
async function consoleServer(greet: Buffer): Promise<{ port: number; received: Buffer[]; sockets: net.Socket[] }> {
  const received: Buffer[] = [];
  const sockets: net.Socket[] = [];
  const server = net.createServer((socket) => {
    sockets.push(socket);
    socket.on("data", (b) => received.push(b));
    socket.write(greet);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { port: (server.address() as AddressInfo).port, received, sockets };
}

/** A console whose bytes the test pushes. */
function pushed(): { stream: ConsoleStream; push(s: string): void; end(err?: Error): void; written: Buffer[]; closed: () => boolean } {
  const data: ((b: Buffer) => void)[] = [];
  const ends: ((err?: Error) => void)[] = [];
  const written: Buffer[] = [];
  let closed = false;
  return {
    stream: { onData: (l) => data.push(l), onEnd: (l) => ends.push(l), write: (b) => written.push(b), close: () => (closed = true) },
    push: (s) => data.forEach((l) => l(Buffer.from(s))),
    end: (err) => ends.forEach((l) => l(err)),
    written,
    closed: () => closed,
  };
}

describe("console sessions", () => {
  it("reads on from where each reader left off, waits for new bytes, and opens one connection per machine", async () => {
    const sessions = new ConsoleSessions();
    const con = pushed();
    let opened = 0;
    const open = async () => (opened++, con.stream);
    const first = await sessions.read("m1", open, { maxBytes: 1024, waitMs: 0 });
    expect(first).toMatchObject({ offset: 0, skipped: 0 });
    con.push("SeaBIOS (version 1.16)\r\n");
    const second = await sessions.read("m1", open, { from: { session: first.session, offset: 0 }, maxBytes: 1024, waitMs: 0 });
    expect(second.data.toString()).toBe("SeaBIOS (version 1.16)\r\n");
    // A waiting read is answered as soon as bytes come.
    const waiting = sessions.read("m1", open, { from: { session: second.session, offset: second.offset }, maxBytes: 1024, waitMs: 5000 });
    setTimeout(() => con.push("iPXE"), 50);
    const started = Date.now();
    expect((await waiting).data.toString()).toBe("iPXE");
    expect(Date.now() - started).toBeLessThan(2000);
    expect(opened).toBe(1);
    sessions.closeAll();
    expect(con.closed()).toBe(true);
  });

  it("tells a reader that fell behind how many bytes it missed", async () => {
    const sessions = new ConsoleSessions({ ringBytes: 8 });
    const con = pushed();
    const open = async () => con.stream;
    const { session } = await sessions.read("m1", open, { maxBytes: 64, waitMs: 0 });
    con.push("0123456789abcdef");
    const read = await sessions.read("m1", open, { from: { session, offset: 0 }, maxBytes: 64, waitMs: 0 });
    expect(read).toMatchObject({ skipped: 8, offset: 16 });
    expect(read.data.toString()).toBe("89abcdef");
    sessions.closeAll();
  });

  it("reports a dropped connection once, then opens a new one", async () => {
    const sessions = new ConsoleSessions();
    const cons = [pushed(), pushed()];
    let n = 0;
    const open = async () => cons[n++]!.stream;
    const { session } = await sessions.read("m1", open, { maxBytes: 64, waitMs: 0 });
    cons[0]!.push("last words");
    cons[0]!.end(new Error("SOL session deactivated"));
    const ended = await sessions.read("m1", open, { from: { session, offset: 0 }, maxBytes: 64, waitMs: 0 });
    expect(ended).toMatchObject({ ended: "SOL session deactivated" });
    expect(ended.data.toString()).toBe("last words");
    const again = await sessions.read("m1", open, { from: { session, offset: ended.offset }, maxBytes: 64, waitMs: 0 });
    expect(again.session).not.toBe(session);
    expect(again.ended).toBeUndefined();
    expect(n).toBe(2);
    sessions.closeAll();
  });

  it("types into the machine's connection", async () => {
    const sessions = new ConsoleSessions();
    const con = pushed();
    await sessions.write("m1", async () => con.stream, Buffer.from("root\r"));
    expect(Buffer.concat(con.written).toString()).toBe("root\r");
    sessions.closeAll();
  });
});

describe("a BMC's Telnet console", () => {
  it("refuses the server's negotiation, keeps it out of the bytes, and escapes 0xFF it types", async () => {
    const IAC = 0xff;
    // DO ECHO, WILL SUPPRESS-GO-AHEAD, a subnegotiation, an escaped 0xFF, then text.
    const greet = Buffer.concat([
      Buffer.from([IAC, 0xfd, 1, IAC, 0xfb, 3, IAC, 0xfa, 24, 1, IAC, 0xf0]),
      Buffer.from("login: "),
      Buffer.from([IAC, IAC]),
    ]);
    const server = await consoleServer(greet);
    const stream = await telnetConsole("127.0.0.1", server.port);
    const got: Buffer[] = [];
    stream.onData((b) => got.push(b));
    await expect.poll(() => Buffer.concat(got).length).toBe(8);
    expect(Buffer.concat(got)).toEqual(Buffer.concat([Buffer.from("login: "), Buffer.from([IAC])]));
    stream.write(Buffer.from([0x61, IAC]));
    await expect.poll(() => Buffer.concat(server.received).includes(Buffer.from([0x61, IAC, IAC]))).toBe(true);
    // WONT ECHO and DONT SUPPRESS-GO-AHEAD went back.
    const answers = Buffer.concat(server.received);
    expect(answers.includes(Buffer.from([IAC, 0xfc, 1]))).toBe(true);
    expect(answers.includes(Buffer.from([IAC, 0xfe, 3]))).toBe(true);
    const ended = new Promise<Error | undefined>((r) => stream.onEnd(r));
    server.sockets[0]!.end();
    expect(await ended).toBeUndefined();
  });

  it("is DRIVER_ERROR naming the console when nothing listens", async () => {
    const server = await consoleServer(Buffer.alloc(0));
    const { port } = server;
    servers.pop()!.close();
    await new Promise((r) => setTimeout(r, 50));
    await expect(telnetConsole("127.0.0.1", port)).rejects.toMatchObject({
      code: "DRIVER_ERROR",
      message: expect.stringContaining(`127.0.0.1:${port}`),
    });
  });
});
