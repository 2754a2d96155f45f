// FileState: the agent's durable state in one directory (Node only).
//
//   key.jwk        the Ed25519 private key (JWK), mode 0600
//   identity.json  nodeId, role, credential, expiry, mode 0600
//   journal.jsonl  the command journal, one JSON record per line, append-only, mode 0600
//   spec.json      the desired NodeSpec last received (a node agent), mode 0600
//
// key.jwk, identity.json and spec.json are replaced atomically (temp file, fsync, rename, fsync of the
// directory), so a crash leaves the old or the new file, never half of one. Every journal
// record is fsynced before the call resolves. The journal is read once, at first use; a torn
// last line (the process died mid-write) is skipped.
import { randomUUID } from "node:crypto";
import { mkdir, open, readFile, rename, rm, type FileHandle } from "node:fs/promises";
import path from "node:path";
import type { NodeSpec, ResultFrame } from "../core/protocol.ts";
import type { AgentIdentity, AgentStateStore, JournalRecord, JournalStart } from "./state.ts";

const FILE_MODE = 0o600;
const DIR_MODE = 0o700;

export class FileState implements AgentStateStore {
  readonly keyFile: string;
  readonly identityFile: string;
  readonly journalFile: string;
  readonly specFile: string;
  #ready: Promise<void> | undefined;
  #journal = new Map<string, JournalRecord>();
  #fh: FileHandle | undefined;
  #appending: Promise<unknown> = Promise.resolve();
  /** Lines of journal.jsonl that could not be read (a torn final write). */
  skippedLines = 0;

  constructor(readonly dir: string) {
    this.keyFile = path.join(dir, "key.jwk");
    this.identityFile = path.join(dir, "identity.json");
    this.journalFile = path.join(dir, "journal.jsonl");
    this.specFile = path.join(dir, "spec.json");
  }

  loadKey(): Promise<JsonWebKey | null> {
    return this.#read<JsonWebKey>(this.keyFile);
  }

  saveKey(privateJwk: JsonWebKey): Promise<void> {
    return this.#write(this.keyFile, JSON.stringify(privateJwk));
  }

  loadIdentity(): Promise<AgentIdentity | null> {
    return this.#read<AgentIdentity>(this.identityFile);
  }

  saveIdentity(identity: AgentIdentity): Promise<void> {
    return this.#write(this.identityFile, `${JSON.stringify(identity, null, 2)}\n`);
  }

  async journal(key: string): Promise<JournalRecord | null> {
    await this.#load();
    return this.#journal.get(key) ?? null;
  }

  async journalStarted(entry: JournalStart): Promise<void> {
    await this.#append({ key: entry.key, id: entry.id, kind: entry.kind, state: "started", at: new Date().toISOString() });
  }

  async journalDone(entry: JournalStart & { result: ResultFrame }): Promise<void> {
    await this.#append({
      key: entry.key,
      id: entry.id,
      kind: entry.kind,
      state: "done",
      at: new Date().toISOString(),
      result: entry.result,
    });
  }

  async entries(): Promise<JournalRecord[]> {
    await this.#load();
    return [...this.#journal.values()];
  }

  loadDesiredSpec(): Promise<NodeSpec | null> {
    return this.#read<NodeSpec>(this.specFile);
  }

  saveDesiredSpec(spec: NodeSpec): Promise<void> {
    return this.#write(this.specFile, JSON.stringify(spec));
  }

  /** Release the journal's file handle (the store reopens it if used again). */
  async close(): Promise<void> {
    await this.#appending.catch(() => {});
    const fh = this.#fh;
    this.#fh = undefined;
    this.#ready = undefined;
    await fh?.close();
  }

  #load(): Promise<void> {
    return (this.#ready ??= this.#open());
  }

  /** One of the directory's JSON files (key, identity, spec), or null when it is not there. */
  async #read<T>(file: string): Promise<T | null> {
    await this.#load();
    return readJson<T>(file);
  }

  /** Replaces one of the directory's files atomically (writeAtomic). */
  async #write(file: string, content: string): Promise<void> {
    await this.#load();
    await writeAtomic(file, content);
  }

  async #open(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: DIR_MODE });
    this.#journal.clear();
    this.skippedLines = 0;
    let text = "";
    try {
      text = await readFile(this.journalFile, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      try {
        const rec = JSON.parse(line) as JournalRecord;
        if (typeof rec.key !== "string" || (rec.state !== "started" && rec.state !== "done")) throw new Error("not a record");
        this.#journal.set(rec.key, rec);
      } catch {
        this.skippedLines++;
      }
    }
    this.#fh = await open(this.journalFile, "a", FILE_MODE);
    await this.#fh.chmod(FILE_MODE);
    // A torn last line must not swallow the next record: end it first.
    if (text.length > 0 && !text.endsWith("\n")) {
      await this.#fh.write("\n");
      await this.#fh.sync();
    }
  }

  async #append(rec: JournalRecord): Promise<void> {
    await this.#load();
    const line = `${JSON.stringify(rec)}\n`;
    const write = this.#appending
      .catch(() => {})
      .then(async () => {
        const fh = this.#fh;
        if (!fh) throw new Error("the journal is closed");
        await fh.write(line);
        await fh.sync();
      });
    this.#appending = write;
    await write;
    this.#journal.set(rec.key, rec);
  }
}

async function readJson<T>(file: string): Promise<T | null> {
  try {
    return JSON.parse(await readFile(file, "utf8")) as T;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw err;
  }
}

/** Write file's new content to a 0600 temp file, fsync, rename over file, fsync the directory. */
export async function writeAtomic(file: string, content: string): Promise<void> {
  const tmp = `${file}.${randomUUID()}.tmp`;
  const fh = await open(tmp, "wx", FILE_MODE);
  try {
    await fh.chmod(FILE_MODE);
    await fh.writeFile(content);
    await fh.sync();
  } catch (err) {
    await fh.close();
    await rm(tmp, { force: true });
    throw err;
  }
  await fh.close();
  await rename(tmp, file);
  const dir = await open(path.dirname(file), "r");
  try {
    await dir.sync();
  } finally {
    await dir.close();
  }
}
