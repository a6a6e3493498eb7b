#!/usr/bin/env python3
"""Reads an `strace -f` log for deploy/systemd/check and judges the sidecar's part of it
against the unit's filters.

    trace.py TRACE EXE ALLOWED DENIED FAMILIES

TRACE: the strace output; EXE: the binary's path (its execve starts the sidecar's part;
every process and thread it clones belongs to it); ALLOWED, DENIED: files with one
system call name a line (the unit's SystemCallFilter= allow list and ~deny list,
groups expanded); FAMILIES: RestrictAddressFamilies=, space-separated. Prints PASS/FAIL
lines.
"""

import re
import sys


def main(trace, exe, allowed_file, denied_file, families):
    allowed = set(open(allowed_file).read().split()) - set(open(denied_file).read().split())
    families = set(families.split())
    mine, calls, sockets, wx = set(), {}, set(), []
    with open(trace, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = re.match(r"(\d+)\s+(.*)", line)
            if not m:
                continue
            pid, rest = int(m.group(1)), m.group(2)
            if rest.startswith(f'execve("{exe}"'):
                mine.add(pid)
            if pid not in mine:
                continue
            c = re.match(r"(?:<\.\.\. )?([a-z0-9_]+)[( ]", rest)
            if not c:
                continue
            name = c.group(1)
            calls[name] = calls.get(name, 0) + 1
            if name in ("clone", "clone3", "fork", "vfork"):
                child = re.search(r"= (\d+)(?: <[^>]*>)?\s*$", rest)
                if child:
                    mine.add(int(child.group(1)))
            if name in ("socket", "socketpair") and not rest.startswith("<..."):
                sockets.add(rest[len(name) + 1:].split(",")[0])
            if name in ("mmap", "mprotect", "pkey_mprotect") and "PROT_WRITE" in rest and "PROT_EXEC" in rest:
                wx.append(rest.strip())
    bad = sorted(set(calls) - allowed)
    out = []
    if not mine:
        out.append("FAIL syscalls: the sidecar's execve is not in the trace")
    elif bad:
        out.append(f"FAIL syscalls: made but filtered out by SystemCallFilter=: {', '.join(bad)}")
    else:
        out.append(f"PASS syscalls: all {len(calls)} distinct system calls of {len(mine)} processes and threads "
                   f"are allowed by SystemCallFilter= ({', '.join(sorted(calls))})")
    if sockets <= families and sockets:
        out.append(f"PASS syscalls: socket families {' '.join(sorted(sockets))} are within RestrictAddressFamilies=")
    else:
        out.append(f"FAIL syscalls: socket families {' '.join(sorted(sockets - families)) or '(none seen)'} "
                   "outside RestrictAddressFamilies=")
    if wx:
        out.append(f"FAIL syscalls: writable and executable mappings (MemoryDenyWriteExecute=): {wx[0]}")
    else:
        out.append("PASS syscalls: no writable and executable mapping (MemoryDenyWriteExecute=)")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
