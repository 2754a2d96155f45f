#!/usr/bin/python3
# bcd's plugin sandbox (docs/bcx.md): bcd runs every plugin not named under [plugins] privileged
# through this helper, as root, with Debian's python3 in isolated mode (python3 -I):
#
#   sandbox.py --user USER [--group GROUP] -- PROGRAM [ARG...]   drop to USER, load the filter, exec PROGRAM
#   sandbox.py --check --user USER [--group GROUP]              can it? (python3-seccomp there, USER known)
#
# It opens PROGRAM while still root (so bcd's own Node runs plugins wherever it is installed), drops
# to the user's uid and gid with no supplementary groups, loads a seccomp filter (libseccomp's
# Python binding, Debian's python3-seccomp; loading it sets no_new_privs) that refuses mounts,
# namespaces, bpf and module loading with EPERM, and execs PROGRAM. Why a helper in Python and not
# in C or bwrap: docs/decisions.md. Any failure is one line on stderr and exit status 126: the
# plugin never runs unsandboxed.
import argparse
import errno
import grp
import os
import pwd
import sys

FAILED = 126

# Refused with EPERM whatever their arguments.
REFUSED = [
    "mount", "umount2", "pivot_root",
    # the new mount API
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns",
    "bpf",
    "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load",
]
# clone(2) with any of these (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
# CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME) in its flags, its first argument on x86_64 and arm64.
CLONE_NEW = [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080]


def fail(message):
    sys.stderr.write(f"bcx-sandbox: {message}\n")
    sys.exit(FAILED)


def resolve(user, group):
    """(uid, gid) for USER (a name or a number) and GROUP (default: the user's own group)."""
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if not user.isdigit():
            fail(f"no user {user} on this machine")
        uid = gid = int(user)  # a numeric uid no passwd entry names: its group is the same number
    if group is not None:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            fail(f"no group {group} on this machine")
    if uid == 0 or gid == 0:
        fail("a sandboxed plugin never runs as root (name it under [plugins] privileged instead)")
    return uid, gid


def build_filter(seccomp):
    # Default allow; only the listed calls are refused. A syscall through another architecture's
    # ABI (i386's int 0x80 on x86_64), which the rules below do not name, kills the process.
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    f.set_attr(seccomp.Attr.CTL_NNP, 1)
    for name in REFUSED:
        f.add_rule(seccomp.ERRNO(errno.EPERM), name)
    for flag in CLONE_NEW:
        f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # clone3 takes its flags in a struct the filter cannot read: ENOSYS makes libc fall back to clone.
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return f


def main():
    parser = argparse.ArgumentParser(prog="sandbox.py")
    parser.add_argument("--user", required=True)
    parser.add_argument("--group")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    try:
        import seccomp
    except ImportError:
        fail("python3-seccomp is not installed (apt-get install python3-seccomp)")
    if os.geteuid() != 0:
        fail("bcd must run as root to run a plugin as another user")
    uid, gid = resolve(args.user, args.group)
    seccomp_filter = build_filter(seccomp)
    if args.check:
        print(f"bcx-sandbox: OK: plugins run as uid {uid} gid {gid} under the seccomp filter")
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        fail("no program to run")
    program = command[0]
    try:
        fd = os.open(program, os.O_RDONLY | os.O_CLOEXEC)
        script = os.pread(fd, 2, 0) == b"#!"
    except OSError as e:
        fail(f"cannot open {program}: {e.strerror}")
    try:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        fail(f"cannot become uid {uid} gid {gid}: {e.strerror}")
    seccomp_filter.load()
    try:
        # A binary runs from the descriptor opened as root; a script (#!) by its path, which its
        # interpreter opens again as the user.
        if script:
            os.execv(program, command)
        else:
            os.execve(fd, command, os.environ)
    except OSError as e:
        fail(f"cannot run {program}: {e.strerror}")


main()
