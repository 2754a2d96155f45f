// renderTemplate: fills {{ name }} placeholders of an installer file (autoinstall user-data,
// kickstart, cloud-init). A value may not break out of its line: these files are YAML or shell,
// where a newline in a value would add configuration of the value's choosing.
import { invalidArgument } from "better-compute/core";

const PLACEHOLDER = /\{\{\s*([a-zA-Z][\w.]*)\s*\}\}/g;

export function renderTemplate(template: string, values: Record<string, string>): string {
  return template.replace(PLACEHOLDER, (_match, name: string) => {
    const value = values[name];
    if (value === undefined) throw invalidArgument(`the template uses {{ ${name} }}, which has no value`, { placeholder: name });
    if (/[\u0000-\u001f\u007f]/.test(value))
      throw invalidArgument(`the value of {{ ${name} }} holds a control character (a newline would inject configuration)`, {
        placeholder: name,
      });
    return value;
  });
}
