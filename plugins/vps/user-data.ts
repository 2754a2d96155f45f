// The cloud-init user data an instance is created with: its hostname and the tenant's SSH keys,
// and for an `agent: bcd` pool the single-use join token and the commands that join it as a node.
// The token is written here and nowhere else: not into a row, an event, a log or an error.
// Every value is written as a JSON string, which YAML reads as a double-quoted scalar, so a key's
// comment cannot break the document.

/** Where the token lands on the instance (root only), removed once bcd has joined. */
export const TOKEN_PATH = "/etc/bcd/join-token";
export const STATE_DIR = "/var/lib/bcd";

export interface UserDataInput {
  hostname: string;
  sshKeys: { name: string; publicKey: string }[];
  /** For agent: bcd pools: the API URL and the provisioned join token. */
  join?: { url: string; token: string };
}

const q = (value: string | string[]) => JSON.stringify(value);

export function renderUserData(input: UserDataInput): string {
  const lines = ["#cloud-config", `hostname: ${q(input.hostname)}`];
  if (input.sshKeys.length) lines.push("ssh_authorized_keys:", ...input.sshKeys.map((k) => `  - ${q(k.publicKey)}`));
  if (input.join) {
    // The image carries bcd and a unit that runs `bcd run --state-dir /var/lib/bcd` once joined.
    const join = ["bcd", "join", "--url", input.join.url, "--attestor", "provisioned", "--token-file", TOKEN_PATH, "--role", "node"];
    lines.push(
      "write_files:",
      `  - path: ${q(TOKEN_PATH)}`,
      `    permissions: "0600"`,
      `    content: ${q(input.join.token)}`,
      "runcmd:",
      `  - ${q([...join, "--state-dir", STATE_DIR])}`,
      `  - ${q(["rm", "-f", TOKEN_PATH])}`,
      `  - ${q(["systemctl", "enable", "--now", "bcd.service"])}`,
    );
  }
  return `${lines.join("\n")}\n`;
}
