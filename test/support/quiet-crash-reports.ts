// The chaos tests' crashes are expected: whatever reports one it survived (the workflow runner, the
// reconcilers) is not printed; every other console line is. Undone by vi.restoreAllMocks().
import { vi } from "vitest";

export function quietCrashReports(): void {
  for (const method of ["warn", "log"] as const) {
    const original = console[method].bind(console);
    vi.spyOn(console, method).mockImplementation((...args: unknown[]) => {
      if (/chaos: (the|this) process died/.test(String(args[0]))) return;
      original(...args);
    });
  }
}
