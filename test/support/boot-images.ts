// Tiny bootable media for tests of real firmware (test/node/qemu-bmc.test.ts): a disk image and an
// ISO that print a marker on the serial console when the firmware boots them, then power the
// machine off when the ACPI power button is pressed (so a graceful shutdown can be seen through).
//
// BIOS: a boot sector of our own (below), in the MBR and as the ISO's El Torito no-emulation image.
// UEFI: Debian's monolithic GRUB (grub-efi-amd64-bin, downloaded and unpacked, never installed)
// with a grub.cfg that echoes the marker and polls the power button through GRUB's iorw module.
// Tools: genisoimage for the ISO, dosfstools and mtools for the UEFI FAT file systems.
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import path from "node:path";

/*
 * The boot sector's code (GNU as, .code16; loaded at 0x7c00, which the CD's no-emulation image is too):
 *   cli; cld; xor %ax,%ax; mov %ax,%ds; mov %ax,%ss; mov $0x7c00,%sp
 *   mov $0x602,%dx; mov $0x100,%ax; out %ax,%dx      PM1_EN: the power button (q35's ACPI PM base is 0x600),
 *                                                    armed before the marker shows: a press before it is lost
 *   mov $0x7c80,%si; call print                      the marker, at offset 0x80
 * 1: mov $0x600,%dx; in %dx,%ax; test $0x100,%ax; jz 1b   wait for PM1_STS.PWRBTN (QMP system_powerdown)
 *   mov $0x7cc0,%si; call print                      the power-off line, at offset 0xc0
 *   mov $0x604,%dx; mov $0x2000,%ax; out %ax,%dx     PM1_CNT: SLP_EN with SLP_TYP 0, QEMU's S5: power off
 * 2: hlt; jmp 2b
 * print: lodsb; test %al,%al; jz 3f; mov %al,%bl
 * 4: mov $0x3fd,%dx; in %dx,%al; test $0x20,%al; jz 4b   COM1 ready for a byte
 *   mov %bl,%al; mov $0x3f8,%dx; out %al,%dx; jmp print
 * 3: ret
 */
const BOOT_CODE = Buffer.from(
  "fafc31c08ed88ed0bc007cba0206b80001efbe807ce81900ba0006eda9000174f7bec07ce80a00ba0406b80020eff4ebfdac84c0741288c3bafd03eca82074f888d8baf803eeebe9c3",
  "hex",
);
const MARKER_AT = 0x80;
const POWEROFF_AT = 0xc0;

/** What a boot of this media prints when it starts, and (the ACPI power button pressed) before it powers off. */
export const bootedLine = (marker: string) => `${marker} booted`;
export const powerButtonLine = (marker: string) => `${marker} power button`;

/** The BIOS boot program, `size` bytes (512 for an MBR, 2048 for a CD's no-emulation image). */
function bootProgram(marker: string, size: number): Buffer {
  const out = Buffer.alloc(size);
  BOOT_CODE.copy(out, 0);
  const line = (text: string, at: number, room: number) => {
    const bytes = Buffer.from(`${text}\r\n\0`, "latin1");
    if (bytes.length > room) throw new Error(`"${text}" is too long for the boot sector`);
    bytes.copy(out, at);
  };
  line(bootedLine(marker), MARKER_AT, POWEROFF_AT - MARKER_AT);
  line(powerButtonLine(marker), POWEROFF_AT, 0x1b8 - POWEROFF_AT); // the MBR's partition table starts at 0x1be
  return out;
}

/** The grub.cfg doing what the boot sector does, under UEFI (the button armed before the marker shows). */
function grubConfig(marker: string): string {
  return [
    "insmod iorw",
    "outw 0x602 0x100",
    `echo ${bootedLine(marker)}`,
    "while true; do",
    "  inw -v pm1 0x600",
    `  if regexp '[13579bdf]..$' "$pm1"; then echo ${powerButtonLine(marker)}; halt; fi`,
    "  sleep 1",
    "done",
    "",
  ].join("\n");
}

/**
 * Where Debian's x86_64-efi GRUB is (monolithic/grubx64.efi, gcdx64.efi and iorw.mod): $BC_GRUB_EFI_DIR,
 * the installed package's /usr/lib/grub/x86_64-efi, or the package unpacked under
 * ~/.cache/better-compute/grub-efi (`apt-get download grub-efi-amd64-bin` then `dpkg-deb -x … ~/.cache/better-compute/grub-efi`).
 */
export function findGrubEfi(): string | undefined {
  const candidates = [
    process.env.BC_GRUB_EFI_DIR,
    "/usr/lib/grub/x86_64-efi",
    path.join(process.env.BC_BUILD_CACHE || path.join(homedir(), ".cache", "better-compute"), "grub-efi/usr/lib/grub/x86_64-efi"),
  ];
  return candidates.find(
    (d): d is string => !!d && ["monolithic/grubx64.efi", "monolithic/gcdx64.efi", "iorw.mod"].every((f) => existsSync(path.join(d, f))),
  );
}

/** The host tools these images need that are missing. */
export function missingTools(uefi: boolean): string[] {
  const tools = ["genisoimage", ...(uefi ? ["mkfs.vfat", "mmd", "mcopy"] : [])];
  return tools.filter((t) => {
    try {
      execFileSync("sh", ["-c", `command -v ${t}`], { stdio: "ignore" });
      return false;
    } catch {
      return true;
    }
  });
}

const run = (argv: string[]) => execFileSync(argv[0]!, argv.slice(1), { stdio: ["ignore", "ignore", "pipe"] });

/** A FAT file system of `mib` MiB in `image` at byte `offset`, holding `files` (path inside → file outside). */
function fatWith(image: string, offset: number, mib: number, files: Record<string, string>): void {
  run(["mkfs.vfat", "--offset", String(offset / 512), image, String(mib * 1024)]);
  const at = `${image}@@${offset}`;
  const dirs = new Set<string>();
  for (const inside of Object.keys(files)) {
    const parts = inside.split("/").slice(0, -1);
    for (let i = 1; i <= parts.length; i++) dirs.add(parts.slice(0, i).join("/"));
  }
  for (const d of [...dirs].sort()) run(["mmd", "-i", at, `::/${d}`]);
  for (const [inside, outside] of Object.entries(files)) run(["mcopy", "-i", at, outside, `::/${inside}`]);
}

/**
 * A raw disk image that boots under BIOS (the MBR's code) and, given GRUB, under UEFI (an EFI
 * system partition at 1 MiB with GRUB as the removable-media loader). Returns its size in bytes.
 */
export function writeBootDisk(file: string, opts: { marker: string; uefiMarker?: string; grubDir?: string }): number {
  const mbr = bootProgram(opts.marker, 512);
  const fatMiB = 16;
  const size = (1 + fatMiB) * 1024 * 1024;
  if (opts.grubDir) {
    // One partition: type EF (EFI system), LBA 2048, fatMiB long.
    const entry = Buffer.alloc(16);
    entry[4] = 0xef;
    entry.writeUInt32LE(2048, 8);
    entry.writeUInt32LE(fatMiB * 2048, 12);
    entry.copy(mbr, 0x1be);
  }
  mbr[510] = 0x55;
  mbr[511] = 0xaa;
  writeFileSync(file, mbr);
  truncateSync(file, size);
  if (opts.grubDir) {
    const work = mkdtempSync(path.join(tmpdir(), "bc-bootdisk-"));
    try {
      writeFileSync(path.join(work, "grub.cfg"), grubConfig(opts.uefiMarker ?? opts.marker));
      // grubx64.efi's built-in prefix is /EFI/debian: its grub.cfg and modules are read from there.
      fatWith(file, 1024 * 1024, fatMiB, {
        "EFI/BOOT/BOOTX64.EFI": path.join(opts.grubDir, "monolithic/grubx64.efi"),
        "EFI/debian/grub.cfg": path.join(work, "grub.cfg"),
        "EFI/debian/x86_64-efi/iorw.mod": path.join(opts.grubDir, "iorw.mod"),
      });
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }
  return size;
}

/** An ISO that boots under BIOS (El Torito, no emulation) and, given GRUB, under UEFI (an El Torito EFI image). */
export function writeBootIso(file: string, opts: { marker: string; uefiMarker?: string; grubDir?: string }): void {
  const root = mkdtempSync(path.join(tmpdir(), "bc-bootiso-"));
  try {
    writeFileSync(path.join(root, "boot.bin"), bootProgram(opts.marker, 2048));
    const eltorito = ["-b", "boot.bin", "-no-emul-boot", "-boot-load-size", "4"];
    if (opts.grubDir) {
      // gcdx64.efi looks for /.disk/info and reads /boot/grub/grub.cfg (and its modules) from that disc.
      mkdirSync(path.join(root, ".disk"));
      writeFileSync(path.join(root, ".disk/info"), "better-compute test media\n");
      mkdirSync(path.join(root, "boot/grub/x86_64-efi"), { recursive: true });
      writeFileSync(path.join(root, "boot/grub/grub.cfg"), grubConfig(opts.uefiMarker ?? opts.marker));
      copyFileSync(path.join(opts.grubDir, "iorw.mod"), path.join(root, "boot/grub/x86_64-efi/iorw.mod"));
      const efiboot = path.join(root, "efiboot.img");
      writeFileSync(efiboot, "");
      truncateSync(efiboot, 5 * 1024 * 1024);
      fatWith(efiboot, 0, 5, { "EFI/BOOT/BOOTX64.EFI": path.join(opts.grubDir, "monolithic/gcdx64.efi") });
      eltorito.push("-eltorito-alt-boot", "-e", "efiboot.img", "-no-emul-boot");
    }
    run(["genisoimage", "-quiet", "-o", file, "-V", "BC_TEST", "-R", "-J", ...eltorito, root]);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}
