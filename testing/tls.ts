// A self-signed TLS identity for emulated machines (a Talos API, an installer's endpoint, a BMC),
// made by the openssl CLI, with its pin computed by openssl as well (as curl --pinnedpubkey
// documents it), not by the code a test checks. Node-only; needs `openssl` on PATH.
import { execFileSync, execSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface SelfSignedCertificate {
  /** PEM private key and certificate, for node:https createServer. */
  key: string;
  cert: string;
  /** base64 SHA-256 of the certificate's DER SubjectPublicKeyInfo: httpViaSite's tlsSpkiSha256. */
  spkiSha256: string;
}

/**
 * altNames (subjectAltName entries, e.g. ["IP:127.0.0.1", "DNS:localhost"]) make the certificate
 * valid for those names, so it verifies when it is itself the trusted CA (a BMC's caBundle); a
 * self-signed certificate is its own CA. days: how long it is valid (default 1).
 */
export function selfSignedCertificate(commonName = "machine", options: { altNames?: string[]; days?: number } = {}): SelfSignedCertificate {
  const dir = mkdtempSync(join(tmpdir(), "bc-tls-"));
  try {
    const key = join(dir, "key.pem");
    const cert = join(dir, "cert.pem");
    const altNames = options.altNames?.length ? ["-addext", `subjectAltName=${options.altNames.join(",")}`] : [];
    const days = String(options.days ?? 1);
    execFileSync(
      "openssl",
      [
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        days,
        "-subj",
        `/CN=${commonName}`,
        ...altNames,
        "-keyout",
        key,
        "-out",
        cert,
      ],
      { stdio: "ignore" },
    );
    const pin = execSync(
      `openssl x509 -in '${cert}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`,
    )
      .toString()
      .trim();
    return { key: readFileSync(key, "utf8"), cert: readFileSync(cert, "utf8"), spkiSha256: pin };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
