// The firecracker inventory's coverage: docs/firecracker-inventory.md has one section per FC id of
// the inventory (test/support/fc-inventory-ids.json, checked in: the inventory itself is not in
// this repository), each with a verdict and the tests that prove it, and every cited test exists
// under that exact title. A test named with an FC id that is not in the inventory, or not cited
// under its id, fails here too: the map cannot fall behind the tests.
import fs from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { repoRoot } from "../../local/node-store.ts";

const DOC = "docs/firecracker-inventory.md";
const INVENTORY = path.resolve(repoRoot, "../shared/seeds/firecracker-provider-inventory.yaml.txt");
const FC_ID = /\bFC-[A-Z0-9]+(?:-[A-Z0-9]+)*/g;
const VERDICTS = ["meets", "partly", "equivalent", "not met", "not applicable"];
/** Paths the doc names in backticks: each must exist. */
const REPO_PATH = /^(?:agent|core|plugins|scripts|workers|durable-objects|migrations|docs|test|bench)\/[\w./-]+$/;

interface Entry {
  id: string;
  status: string;
  gist: string;
}
interface Section {
  id: string;
  line: number;
  lesson: string[];
  verdict: string[];
  tests: string[];
}
interface Citation {
  file: string;
  title: string;
}

const read = (file: string) => fs.readFileSync(path.join(repoRoot, file), "utf8");
const inventory = JSON.parse(read("test/support/fc-inventory-ids.json")) as { source: string; extracted: string; entries: Entry[] };
const ids = inventory.entries.map((e) => e.id);
const doc = read(DOC);

/** One `### FC-…` section per id; its `- **Lesson**:`, `- **Verdict**:` and `- **Tests**:` lines. */
function sections(text: string): Section[] {
  const found: Section[] = [];
  let current: Section | undefined;
  text.split("\n").forEach((line, i) => {
    const heading = /^#{1,6}\s+(.*)$/.exec(line);
    if (heading) {
      const id = /^(FC-[A-Z0-9-]+)\s*$/.exec(heading[1]!)?.[1];
      current = id ? { id, line: i + 1, lesson: [], verdict: [], tests: [] } : undefined;
      if (current) found.push(current);
      return;
    }
    const field = /^- \*\*(Lesson|Verdict|Tests)\*\*:\s*(.*)$/.exec(line);
    if (current && field) current[field[1]!.toLowerCase() as "lesson" | "verdict" | "tests"].push(field[2]!);
  });
  return found;
}

/** `path::title` citations in backticks. */
function citations(text: string): Citation[] {
  return [...text.matchAll(/`([^`\s]+\.test\.ts)::([^`]+)`/g)].map((m) => ({ file: m[1]!, title: m[2]! }));
}

/** The literal titles of every it( / test( in a test file (a title may start on the line after the call). */
function testTitles(source: string): string[] {
  const titles: string[] = [];
  for (const m of source.matchAll(
    /(?<![.\w])(?:it|test)(?:\.(?:only|skip|todo|concurrent|skipIf\([^)]*\)|runIf\([^)]*\)))?\(\s*(["'`])((?:\\.|(?!\1)[^\\])*)\1/g,
  ))
    titles.push(m[2]!.replace(/\\(.)/g, "$1"));
  return titles;
}

function testFiles(dir: string): string[] {
  return fs
    .readdirSync(path.join(repoRoot, dir), { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".test.ts"))
    .map((f) => `${dir}/${f.split(path.sep).join("/")}`)
    .sort();
}

const docSections = sections(doc);
const titlesByFile = new Map(testFiles("test").map((f) => [f, testTitles(read(f))]));

describe("the checked-in inventory ids", () => {
  it("lists each FC id once, with where it came from and when", () => {
    expect(inventory.source).toMatch(/firecracker-provider-inventory/);
    expect(inventory.extracted).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(ids.length).toBeGreaterThan(0);
    for (const e of inventory.entries) {
      expect(e.id).toMatch(/^FC-[A-Z0-9]+(-[A-Z0-9]+)*$/);
      expect(e.gist.length, e.id).toBeGreaterThan(0);
    }
    expect(new Set(ids).size).toBe(ids.length);
  });

  // The inventory lives beside the repository on the machines it was written on, not in a clone.
  it.skipIf(!fs.existsSync(INVENTORY))("are the inventory's ids, in its order (when the inventory is at hand)", () => {
    const text = fs.readFileSync(INVENTORY, "utf8");
    expect([...text.matchAll(/- id: (FC-[A-Z0-9-]+)/g)].map((m) => m[1])).toEqual(ids);
  });
});

describe(`${DOC}`, () => {
  it("has exactly one section per inventory id, and none for an id the inventory does not have", () => {
    const named = docSections.map((s) => s.id);
    const missing = ids.filter((id) => !named.includes(id));
    const twice = named.filter((id, i) => named.indexOf(id) !== i);
    const unknown = named.filter((id) => !ids.includes(id));
    expect({ missing, twice, unknown }).toEqual({ missing: [], twice: [], unknown: [] });
  });

  it("gives every section one lesson, one verdict and its tests (or none: and why)", () => {
    for (const s of docSections) {
      const where = `${DOC}:${s.line} ${s.id}`;
      expect([s.lesson.length, s.verdict.length, s.tests.length], `${where}: Lesson, Verdict and Tests once each`).toEqual([1, 1, 1]);
      expect(s.lesson[0]!.length, `${where}: an empty lesson`).toBeGreaterThan(10);
      const verdict = VERDICTS.find((v) => s.verdict[0]!.toLowerCase().startsWith(v));
      expect(verdict, `${where}: the verdict starts with one of ${VERDICTS.join(", ")}`).toBeDefined();
      const tests = s.tests[0]!;
      if (tests.startsWith("none:")) expect(tests.length, `${where}: "none:" says why`).toBeGreaterThan("none: ".length + 10);
      else expect(citations(tests).length, `${where}: cites no test as \`path::title\``).toBeGreaterThan(0);
    }
  });

  it("cites only tests that exist: the file, and an it() whose title starts with the cited text", () => {
    const broken: string[] = [];
    for (const s of docSections)
      for (const c of citations(s.tests.join("\n"))) {
        const titles = titlesByFile.get(c.file);
        if (!titles) broken.push(`${s.id}: ${c.file} is not a test file`);
        else if (!titles.some((t) => t.startsWith(c.title))) broken.push(`${s.id}: ${c.file} has no test titled "${c.title}"`);
      }
    expect(broken).toEqual([]);
  });

  it("names only files that exist", () => {
    const named = [...doc.matchAll(/`([^`\s:]+)`/g)].map((m) => m[1]!).filter((p) => REPO_PATH.test(p));
    expect(named.length).toBeGreaterThan(0);
    expect(named.filter((p) => !fs.existsSync(path.join(repoRoot, p)))).toEqual([]);
  });
});

describe("test titles that name an FC id", () => {
  it("name ids of the inventory, and are cited under every id they name", () => {
    const unknown: string[] = [];
    const uncited: string[] = [];
    const cited = new Map(docSections.map((s) => [s.id, citations(s.tests.join("\n"))]));
    for (const [file, titles] of titlesByFile)
      for (const title of titles)
        for (const id of new Set(title.match(FC_ID) ?? [])) {
          if (!ids.includes(id)) unknown.push(`${file}: "${title}" names ${id}`);
          else if (!cited.get(id)?.some((c) => c.file === file && title.startsWith(c.title)))
            uncited.push(`${id} is not cited as ${file}::${title}`);
        }
    expect({ unknown, uncited }).toEqual({ unknown: [], uncited: [] });
  });
});
