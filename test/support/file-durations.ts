// A vitest reporter beside the default one: how long each test file took, written as JSON to its
// outputFile (vitest.config.ts adds it when BC_TEST_DURATIONS names one; .ci/run prints the
// slowest files of its lanes from them). A file's time is all of it: the environment, importing
// the file, its setup files, and every test and hook, beforeAll and afterAll included (vitest's
// json reporter spans only its first test's start to its last test's end).
import fs from "node:fs";
import path from "node:path";
import type { Reporter, TestModule, Vitest } from "vitest/node";

export interface FileDuration {
  /** Relative to the repository. */
  file: string;
  project: string;
  ms: number;
  state: string;
}

export default class FileDurations implements Reporter {
  private root = process.cwd();

  constructor(private readonly options: { outputFile: string }) {}

  onInit(vitest: Vitest) {
    this.root = vitest.config.root;
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>) {
    const files: FileDuration[] = modules.map((module) => {
      const d = module.diagnostic();
      return {
        file: path.relative(this.root, module.moduleId),
        project: module.project.name,
        ms: Math.round(d.environmentSetupDuration + d.prepareDuration + d.collectDuration + d.setupDuration + d.duration),
        state: module.state(),
      };
    });
    fs.mkdirSync(path.dirname(this.options.outputFile), { recursive: true });
    fs.writeFileSync(this.options.outputFile, `${JSON.stringify(files, null, 1)}\n`);
  }
}
