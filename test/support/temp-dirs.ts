// Temporary directories for one test file, removed when its tests are done.
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll } from "vitest";

/** Returns a maker of temp dirs (named prefix…) that the file's afterAll removes. Call it at the top of the file. */
export function tempDirs(): (prefix: string) => string {
  const made: string[] = [];
  afterAll(() => made.forEach((dir) => fs.rmSync(dir, { recursive: true, force: true })));
  return (prefix) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
    made.push(dir);
    return dir;
  };
}
