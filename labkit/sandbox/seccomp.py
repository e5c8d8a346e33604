"""A seccomp filter for every box: the kernel's shared objects stay out of student code's reach.

Namespaces separate most of what one box could leave for another (`bwrap.py`), but some kernel
objects are not namespaced at all: a uid's *key rings* are one per uid, so a submission could
store its solution in a key and a later one (same uid) read it. Others are attack surface no
Python program running student code needs: eBPF, perf, userfaultfd, io_uring (its operations
bypass seccomp altogether), module loading, kexec, mounting, new namespaces, ptrace and the
cross-process memory calls. This module compiles, once per process, a filter (libseccomp via
PyPI's `pyseccomp`, a ctypes binding) that fails those calls with EPERM, and hands bwrap a fresh
fd to read it from (`bwrap --seccomp FD`); bwrap installs it right before it execs
`setpriv -> prlimit -> program`, so everything in the box runs under it.

Default: allow. What Python, sqlite3, asyncio, threads, subprocess (fork, vfork, exec, a clone
without namespace flags), sockets, setpriv (setresuid, setgroups, capset, prctl) and prlimit
need is never touched. `clone3` answers ENOSYS (its flags are in memory, which seccomp cannot
read), so glibc falls back to `clone`, whose flags are checked: that is what Docker and Flatpak
do. System calls of another ABI (i386 `int 0x80`, x32) kill the process.

Two filters: `STUDENT` for every box that drops privileges; `NESTING` for the judge's own box
(trusted, root, it runs bwrap for its children and so must mount and unshare): everything but
the mount and namespace calls. Filters stack, so a child started inside the judge's box runs
under both.

Without `pyseccomp` or the system's libseccomp2 no box starts (`SeccompUnavailable`, an
OSError whose message says what to install): a sandbox that silently lost its filter would
look like one that has it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import tempfile
import threading

STUDENT = "student"
NESTING = "nesting"

# Kernel objects and attack surface no box needs, the judge's own included (Docker's default
# profile denies each of these too).
NEVER = (
    # key rings: one per uid, not per namespace (a key would outlive the box for the next one)
    "add_key", "keyctl", "request_key",
    # reading or changing other processes, or the kernel
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd", "kcmp",
    "migrate_pages", "move_pages",
    "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie", "fanotify_init",
    # io_uring: its operations are not system calls, so no filter would see them
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "create_module", "get_kernel_syms", "query_module", "swapon", "swapoff", "reboot", "acct",
    "quotactl", "quotactl_fd", "syslog", "iopl", "ioperm", "vm86", "vm86old", "nfsservctl",
    "settimeofday", "clock_settime", "stime", "open_by_handle_at", "name_to_handle_at",
    "uselib", "ustat", "sysfs", "_sysctl",
)
# Mounting and namespaces: student code has no reason for either; the judge's box needs them
# to start bwrap for its children.
CONFINING = (
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "setns", "unshare",
)
# clone(2)'s flags that make a namespace (CLONE_NEWTIME, 0x80, is clone3/unshare only: in
# clone's flags that bit is part of the exit signal).
CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# personality(2) flags that weaken the process's own defences (no ASLR, executable data).
PERSONALITY_FLAGS = {"ADDR_NO_RANDOMIZE": 0x0040000, "MMAP_PAGE_ZERO": 0x0100000,
                     "ADDR_COMPAT_LAYOUT": 0x0200000, "READ_IMPLIES_EXEC": 0x0400000}

INSTALL = ("pip install pyseccomp (the course's dependency), and the system's libseccomp2 "
           "(Debian: apt-get install libseccomp2)")


class SeccompUnavailable(OSError):
    """The filter cannot be built here (no pyseccomp, or no libseccomp2); no box may start."""


_IMPORT_LOCK = threading.Lock()


def _pyseccomp():
    """Import pyseccomp, finding libseccomp and libc by their sonames first.

    pyseccomp looks them up with `ctypes.util.find_library`, which reads the ld.so cache and
    falls back to gcc or ld: inside the judge's box there is no /etc/ld.so.cache, and a machine
    without a compiler would then find nothing. dlopen finds the sonames in the system paths."""
    with _IMPORT_LOCK:
        original = ctypes.util.find_library

        def find(name: str):
            soname = {"seccomp": "libseccomp.so.2", "c": "libc.so.6"}.get(name)
            if soname is not None:
                try:
                    ctypes.CDLL(soname)
                    return soname
                except OSError:
                    pass
            return original(name)

        ctypes.util.find_library = find
        try:
            import pyseccomp
        except (ImportError, RuntimeError, OSError) as exc:
            raise SeccompUnavailable(f"no seccomp filter for the sandbox ({exc}): {INSTALL}") from None
        finally:
            ctypes.util.find_library = original
    return pyseccomp


def _deny(flt, lib, action: int, name: str, *args) -> None:
    """One rule, for a system call this architecture has (others are left out, not faked)."""
    if lib.resolve_syscall(lib.Arch.NATIVE, name) < 0:
        return
    flt.add_rule(action, name, *args)


@functools.cache
def program(kind: str = STUDENT) -> bytes:
    """The compiled BPF program (built once per process and kind)."""
    if kind not in (STUDENT, NESTING):
        raise ValueError(f"no seccomp filter called {kind!r}")
    lib = _pyseccomp()
    eperm = lib.ERRNO(errno.EPERM)
    flt = lib.SyscallFilter(lib.ALLOW)
    flt.set_attr(lib.Attr.ACT_BADARCH, lib.KILL_PROCESS)  # another ABI (i386, x32): killed
    for name in NEVER:
        _deny(flt, lib, eperm, name)
    for flag in PERSONALITY_FLAGS.values():
        _deny(flt, lib, eperm, "personality", lib.Arg(0, lib.MASKED_EQ, flag, flag))
    if kind == STUDENT:
        for name in CONFINING:
            _deny(flt, lib, eperm, name)
        for flag in CLONE_NAMESPACES.values():
            _deny(flt, lib, eperm, "clone", lib.Arg(0, lib.MASKED_EQ, flag, flag))
        _deny(flt, lib, lib.ERRNO(errno.ENOSYS), "clone3")  # glibc then uses clone, checked above
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()


def available() -> str:
    """'' when the filter can be built here, else why not (in words an instructor can act on)."""
    try:
        program(STUDENT)
        program(NESTING)
    except SeccompUnavailable as exc:
        return str(exc)
    return ""


def filter_fd(kind: str = STUDENT) -> int:
    """A fresh fd to read the filter from, at offset 0, for `bwrap --seccomp FD`.

    The caller passes it on (Popen `pass_fds`) and closes its own copy once bwrap has started.
    A memfd: no size limit (a pipe holds 64 KB), and nothing on disk."""
    data = program(kind)
    fd = os.memfd_create("labkit-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
