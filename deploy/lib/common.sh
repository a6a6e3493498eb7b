# Shared by the deploy checks (sourced, not run). Expects REPO (the repository root).
# Each check prints "PASS name", "FAIL name: why" or "SKIP name: why" per step and keeps
# going where it can; `finish` exits non-zero when any step failed.

DEPLOY_FAILED=0
DEPLOY_PASSED=0

pass() { DEPLOY_PASSED=$((DEPLOY_PASSED + 1)); printf 'PASS %s\n' "$*"; }
fail() { DEPLOY_FAILED=$((DEPLOY_FAILED + 1)); printf 'FAIL %s\n' "$*"; }
skip() { printf 'SKIP %s\n' "$*"; }
note() { printf '     %s\n' "$*"; }
step() { printf '\n== %s\n' "$*"; }

finish() {
    printf '\n%s: %d passed, %d failed\n' "$1" "$DEPLOY_PASSED" "$DEPLOY_FAILED"
    [ "$DEPLOY_FAILED" -eq 0 ]
}

# Where the build stage's WORKDIR is reproduced, and the shared cargo target directory.
# Fixed paths: cargo's fingerprints stay valid from one run to the next.
BUILD_DIR="$REPO/target/deploy/build-workdir"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
BINARY="$CARGO_TARGET_DIR/release/knowtation-sidecar"
LIBS_FILE="$REPO/deploy/image/distroless-cc-debian12-amd64.libs"
DOCKERFILE_PY=(python3 "$REPO/deploy/lib/dockerfile.py")

# The Dockerfile's build stage, outside a container: its COPY lines materialized under
# BUILD_DIR (standing for WORKDIR), then each of its RUN lines run there, in order.
build_like_dockerfile() {
    rm -rf "$BUILD_DIR" && mkdir -p "$BUILD_DIR" || return 1
    "${DOCKERFILE_PY[@]}" context "$REPO/Dockerfile" "$REPO" "$BUILD_DIR" || return 1
    local line
    while IFS= read -r line; do
        note "RUN $line"
        (cd "$BUILD_DIR" && bash -euo pipefail -c "$line") || return 1
    done < <("${DOCKERFILE_PY[@]}" runs "$REPO/Dockerfile")
    [ -x "$BINARY" ]
}

# The files of the distroless base the sidecar relies on, from this Debian 12 host: the
# binary's libraries and ELF interpreter (checked against LIBS_FILE by verify-image), the
# CA bundle, the user database and nsswitch.conf, /tmp and the nonroot home; plus the
# mount points and files a container runtime provides (/proc, /dev nodes, resolv.conf,
# hosts). Then the runtime stage's COPY lines. $1: an empty directory.
assemble_rootfs() {
    local root=$1 lib
    mkdir -p "$root"/{etc/ssl/certs,tmp,home/nonroot,proc,dev,usr/local/bin} || return 1
    chmod 1777 "$root/tmp"
    chown 65532:65532 "$root/home/nonroot"
    for lib in $(binary_needs_paths); do
        copy_base_file "$lib" "$root" || return 1
    done
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt" || return 1
    # The base's user database (uids 0, 65534 and nonroot 65532) and name service order.
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' \
        >"$root/etc/group"
    printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$root/etc/nsswitch.conf"
    # What the container runtime injects.
    cp /etc/resolv.conf "$root/etc/resolv.conf" && cp /etc/hosts "$root/etc/hosts" || return 1
    touch "$root"/dev/{null,zero,random,urandom}
    "${DOCKERFILE_PY[@]}" rootfs "$REPO/Dockerfile" "$REPO" "$BUILD_DIR" "$CARGO_TARGET_DIR" "$root" \
        | sed 's/^/     image: /'
    return "${PIPESTATUS[0]}"
}

# Copies the host file $1 to the same path under $2, keeping a symlink a symlink (and
# copying what it points to). Directories on the way are made real directories: the
# base keeps /lib and /lib64 apart where this host may merge them into /usr.
copy_base_file() {
    local path=$1 root=$2 target
    mkdir -p "$root$(dirname "$path")" || return 1
    if [ -L "$path" ]; then
        target=$(readlink "$path")
        ln -sfn "$target" "$root$path" || return 1
        case "$target" in /*) ;; *) target="$(dirname "$path")/$target" ;; esac
        copy_base_file "$target" "$root"
    else
        cp --preserve=mode,timestamps "$path" "$root$path"
    fi
}

# The absolute paths (from LIBS_FILE) of the binary's DT_NEEDED libraries and its ELF
# interpreter; a name missing from LIBS_FILE prints nothing for it.
binary_needs_paths() {
    local name
    { binary_interpreter; binary_needed; } | while IFS= read -r name; do
        lib_path "$name"
    done
}

# The LIBS_FILE path whose file name (or whole path) is $1.
lib_path() {
    awk -v n="$1" '!/^#/ && NF == 2 && $1 != "glibc-max" {
        p = $2; b = p; sub(/.*\//, "", b)
        if (p == n || b == n) { print p; exit }
    }' "$LIBS_FILE"
}

binary_needed() {
    readelf -d "$BINARY" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'
}

binary_interpreter() {
    readelf -l "$BINARY" | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p'
}

# Runs a command as uid/gid 65532 with $1 as the root filesystem, read-only, in a mount
# namespace of its own (so every mount vanishes with it): /proc and /dev nodes mounted as
# a container runtime would, and STATE_MOUNT (a directory inside the root), if set, a
# fresh tmpfs mounted with STATE_MOUNT_OPTS (owner, mode). The environment is only
# RUN_ENV (an array of NAME=VALUE). With NETNS set, in that network namespace. Runs in
# the foreground; callers background it.
run_in_rootfs() {
    local root=$1; shift
    local -a netns=()
    [ -n "${NETNS:-}" ] && netns=(ip netns exec "$NETNS")
    "${netns[@]}" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        unshare --mount --propagation private --fork --kill-child -- \
        /bin/bash -euc '
            root=$1 state=$2 state_opts=$3; shift 3
            vars=()
            while [ "$1" != -- ]; do vars+=("$1"); shift; done
            shift
            mount --bind "$root" "$root"
            mount -o remount,bind,ro "$root"
            mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
            for d in null zero random urandom; do mount --bind "/dev/$d" "$root/dev/$d"; done
            if [ -n "$state" ]; then
                mount -t tmpfs -o "nosuid,nodev,size=64m,$state_opts" tmpfs "$root$state"
            fi
            exec /usr/bin/env -i "${vars[@]}" /usr/sbin/chroot --userspec=65532:65532 "$root" "$@"
        ' bash "$root" "${STATE_MOUNT:-}" "${STATE_MOUNT_OPTS:-}" "${RUN_ENV[@]}" -- "$@"
}

# The last process of the chain started under $1 (subshell, unshare, the command): the
# command itself, once it runs.
leaf_pid() {
    local pid=$1 child
    while child=$(pgrep -P "$pid" | head -n1) && [ -n "$child" ]; do pid=$child; done
    echo "$pid"
}
