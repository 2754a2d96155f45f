// A self-signed TLS identity for emulated machines (a Talos API, an installer's endpoint), made by
// the openssl CLI, with its pin computed by openssl as well (as curl --pinnedpubkey documents it),
// not by the code a test checks. Node-only; needs `openssl` on PATH.
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

export function selfSignedCertificate(commonName = "machine"): SelfSignedCertificate {
  const dir = mkdtempSync(join(tmpdir(), "bc-tls-"));
  try {
    const key = join(dir, "key.pem");
    const cert = join(dir, "cert.pem");
    execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", `/CN=${commonName}`, "-keyout", key, "-out", cert], { stdio: "ignore" });
    const pin = execSync(`openssl x509 -in '${cert}' -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`).toString().trim();
    return { key: readFileSync(key, "utf8"), cert: readFileSync(cert, "utf8"), spkiSha256: pin };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
