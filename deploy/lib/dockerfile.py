#!/usr/bin/env python3
"""Reads the top-level Dockerfile so deploy/verify-image can redo what it describes
without a container engine, and cannot drift from it.

    dockerfile.py runs      DOCKERFILE                 the build stage's RUN commands,
                                                       one per line
    dockerfile.py context   DOCKERFILE REPO OUT        materializes the build stage's
                                                       COPY lines (from the build
                                                       context REPO) under OUT, which
                                                       stands for the stage's WORKDIR
    dockerfile.py rootfs    DOCKERFILE REPO BUILD TARGET ROOTFS
                                                       applies the last stage's COPY
                                                       lines to ROOTFS: --from=<build>
                                                       paths under WORKDIR come from
                                                       BUILD, under WORKDIR/target from
                                                       TARGET (CARGO_TARGET_DIR); other
                                                       sources from REPO; --chown kept
    dockerfile.py image     DOCKERFILE                 the last stage's FROM, USER,
                                                       EXPOSE, ENTRYPOINT and CMD as
                                                       KEY=VALUE lines

Only the instructions this project's Dockerfile uses are understood (FROM, WORKDIR,
COPY, RUN, USER, EXPOSE, ENTRYPOINT, CMD, and ARG with a name alone in the build stage:
its value, as `--build-arg` would give it, is the variable of that name in the
environment the RUN lines run in); anything else, or a flag it does not know, is an
error, so a change to the Dockerfile cannot be skipped over silently.
"""

import json
import os
import shlex
import shutil
import sys

KNOWN = {"FROM", "WORKDIR", "COPY", "RUN", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "ARG"}


def die(msg):
    print(f"dockerfile.py: {msg}", file=sys.stderr)
    sys.exit(2)


def instructions(path):
    """(keyword, argument text) pairs; comments dropped, continuations joined."""
    out, pending = [], ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if pending and line.lstrip().startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            full = (pending + line).strip()
            pending = ""
            word, _, rest = full.partition(" ")
            word = word.upper()
            if word not in KNOWN:
                die(f"unsupported instruction {word}")
            out.append((word, rest.strip()))
    if pending:
        die("dangling line continuation")
    return out


def stages(path):
    """A list of stages: dict(base, name, steps=[(word, rest)])."""
    result = []
    for word, rest in instructions(path):
        if word == "FROM":
            parts = rest.split()
            name = None
            if len(parts) == 3 and parts[1].upper() == "AS":
                name = parts[2]
            elif len(parts) != 1:
                die(f"unsupported FROM form: {rest}")
            result.append({"base": parts[0], "name": name, "steps": []})
        else:
            if not result:
                die(f"{word} before FROM")
            result[-1]["steps"].append((word, rest))
    if len(result) < 2:
        die("expected a build stage and a runtime stage")
    return result


def copy_args(rest):
    """(flags dict, sources, dest) of a COPY line (shell form)."""
    words = shlex.split(rest)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, value = words.pop(0)[2:].partition("=")
        if key not in ("from", "chown"):
            die(f"unsupported COPY flag --{key}")
        flags[key] = value
    if len(words) < 2:
        die(f"COPY needs a source and a destination: {rest}")
    return flags, words[:-1], words[-1]


def workdir_of(stage):
    wd = "/"
    for word, rest in stage["steps"]:
        if word == "WORKDIR":
            wd = os.path.normpath(os.path.join(wd, rest))
    return wd


def build_stage(all_stages):
    """The stage the runtime copies from (the only named earlier stage)."""
    named = [s for s in all_stages[:-1] if s["name"]]
    if len(named) != 1:
        die("expected exactly one named build stage")
    return named[0]


def copy_into(src, dest, dest_is_dir_hint, chown):
    """Docker COPY semantics for one source: a directory's contents go into dest; a file
    goes to dest, or into it when dest ends with '/' or is an existing directory."""
    if os.path.isdir(src) and not os.path.islink(src):
        os.makedirs(dest, exist_ok=True)
        shutil.copystat(src, dest)
        for name in sorted(os.listdir(src)):
            copy_into(os.path.join(src, name), os.path.join(dest, name), False, chown)
        if chown:
            os.chown(dest, *chown)
        return
    if not os.path.exists(src) and not os.path.islink(src):
        die(f"COPY source missing: {src}")
    if dest_is_dir_hint or os.path.isdir(dest):
        dest = os.path.join(dest, os.path.basename(src))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(src, dest, follow_symlinks=False)
    if chown:
        os.chown(dest, *chown, follow_symlinks=False)


def parse_chown(value):
    if value is None:
        return None
    user, _, group = value.partition(":")
    if not user.isdigit() or not (group or user).isdigit():
        die("--chown must be numeric uid:gid (the runtime base has no user database to resolve names)")
    return int(user), int(group or user)


def cmd_runs(dockerfile):
    stage = build_stage(stages(dockerfile))
    for word, rest in stage["steps"]:
        if word == "RUN":
            if rest.startswith("["):
                die("exec-form RUN is not supported")
            print(rest)


def cmd_context(dockerfile, repo, out):
    stage = build_stage(stages(dockerfile))
    wd = "/"
    for word, rest in stage["steps"]:
        if word == "WORKDIR":
            wd = os.path.normpath(os.path.join(wd, rest))
        elif word == "COPY":
            flags, sources, dest = copy_args(rest)
            if "from" in flags:
                die("COPY --from in the build stage is not supported")
            target = os.path.normpath(os.path.join(wd, dest))
            build_wd = workdir_of(stage)
            if os.path.commonpath([target, build_wd]) != build_wd:
                die(f"build-stage COPY outside WORKDIR: {dest}")
            local = os.path.join(out, os.path.relpath(target, build_wd))
            for src in sources:
                copy_into(os.path.join(repo, src), local, dest.endswith("/") or len(sources) > 1,
                          parse_chown(flags.get("chown")))
        elif word == "ARG":
            if not rest.replace("_", "a").isalnum() or not rest[:1].isalpha():
                die(f"ARG takes a name alone (no default): {rest}")
        elif word not in ("RUN",):
            die(f"unsupported instruction in the build stage: {word}")


def cmd_rootfs(dockerfile, repo, build, target, rootfs):
    all_stages = stages(dockerfile)
    bstage = build_stage(all_stages)
    build_wd = workdir_of(bstage)
    runtime = all_stages[-1]
    for word, rest in runtime["steps"]:
        if word != "COPY":
            continue
        flags, sources, dest = copy_args(rest)
        if not dest.startswith("/"):
            die(f"runtime COPY destinations must be absolute: {dest}")
        chown = parse_chown(flags.get("chown"))
        for src in sources:
            if "from" in flags:
                if flags["from"] != bstage["name"]:
                    die(f"COPY --from={flags['from']}: unknown stage")
                path = os.path.normpath(src)
                if os.path.commonpath([path, build_wd]) != build_wd:
                    die(f"COPY --from source outside the build WORKDIR: {src}")
                rel = os.path.relpath(path, build_wd)
                if rel == "target" or rel.startswith("target/"):
                    local = os.path.join(target, os.path.relpath(rel, "target"))
                else:
                    local = os.path.join(build, rel)
            else:
                local = os.path.join(repo, src)
            copy_into(local, rootfs + dest, dest.endswith("/") or len(sources) > 1, chown)
            print(f"{dest}\t{'from ' + flags['from'] + ' ' if 'from' in flags else ''}{src}"
                  f"{'  (owner ' + flags['chown'] + ')' if chown else ''}")


def cmd_image(dockerfile):
    runtime = stages(dockerfile)[-1]
    print(f"FROM={runtime['base']}")
    for word, rest in runtime["steps"]:
        if word in ("USER", "EXPOSE"):
            print(f"{word}={rest}")
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                die(f"{word} must be in exec (JSON) form")
            print(f"{word}={shlex.join(value)}")
        elif word != "COPY":
            die(f"unsupported instruction in the runtime stage: {word}")


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    cmd, args = argv[1], argv[2:]
    table = {"runs": (cmd_runs, 1), "context": (cmd_context, 3),
             "rootfs": (cmd_rootfs, 5), "image": (cmd_image, 1)}
    if cmd not in table or len(args) != table[cmd][1]:
        die(__doc__)
    table[cmd][0](*args)


if __name__ == "__main__":
    main(sys.argv)
