#!/usr/bin/env bash
# A Debian root file system with another OTP in it, built once and cached:
# trixie has OTP 27, sid OTP 29. Prints the root's path.
#   scripts/otp-root.sh SUITE [PACKAGE...]
# Extra packages are installed into the root (once each). Needs root, and
# debootstrap (installed from Debian's packages when missing). The mirror is
# the one this machine's apt already uses.
# Cache: ${BEAMDIAG_CACHE:-/var/cache/beamdiag}/roots/SUITE
set -euo pipefail
suite=${1:?usage: scripts/otp-root.sh SUITE [PACKAGE...]}
shift
case "$suite" in
    trixie|sid|forky|bookworm) ;;
    *) echo "otp-root: unknown suite '$suite' (trixie: OTP 27, sid: OTP 29)" >&2; exit 2 ;;
esac
cache=${BEAMDIAG_CACHE:-/var/cache/beamdiag}
root="$cache/roots/$suite"
apt_opts=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -o Dpkg::Use-Pty=0)

mirror() {
    # The first binary source this machine's apt uses (deb822 or one-line).
    local m
    m=$(awk '/^Types:/ {deb = ($0 ~ /(^|[ \t])deb([ \t]|$)/)} deb && /^URIs:/ {print $2; exit}' \
            /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$m" ] || m=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
                           /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
    [ -n "$m" ] || { echo "otp-root: no Debian mirror found in this machine's apt sources" >&2; exit 1; }
    echo "$m"
}

# One build of a root at a time: a second caller (another suite, or the
# same one again after a timetrap killed the first caller while debootstrap
# went on) waits for the first instead of deleting its tree under it.
mkdir -p "$cache/roots"
exec 9>"$cache/roots/.$suite.lock"
flock 9

if [ ! -f "$root/.beamdiag-ready" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "otp-root: building $root needs root" >&2; exit 1; }
    if ! command -v debootstrap >/dev/null 2>&1; then
        echo "otp-root: installing debootstrap" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
            { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
                  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
    fi
    url=$(mirror)
    # A build that died inside debootstrap leaves its file systems mounted.
    for m in proc sys dev/pts dev; do
        if mountpoint -q "$root.tmp/$m" 2>/dev/null; then umount -l "$root.tmp/$m" || true; fi
    done
    rm -rf "$root.tmp"
    mkdir -p "$(dirname "$root")"
    echo "otp-root: debootstrap $suite into $root (about a minute)" >&2
    debootstrap --variant=minbase --include=erlang-base "$suite" "$root.tmp" "$url" \
        >"$root.log" 2>&1 || { echo "otp-root: debootstrap failed, see $root.log" >&2; tail -5 "$root.log" >&2; exit 1; }
    # Name resolution as on the host, so short node names work alike.
    cp /etc/hosts "$root.tmp/etc/hosts"
    cp /etc/hostname "$root.tmp/etc/hostname" 2>/dev/null || hostname > "$root.tmp/etc/hostname"
    rm -rf "$root" && mv "$root.tmp" "$root"
    touch "$root/.beamdiag-ready"
fi

missing=()
for p in "$@"; do
    [ -f "$root/.beamdiag-pkg-$p" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" -eq 0 ] || { echo "otp-root: installing into $root needs root" >&2; exit 1; }
    echo "otp-root: installing ${missing[*]} into $suite" >&2
    here=$(dirname "$0")
    "$here/otp-run.sh" "$suite" sh -c "apt-get ${apt_opts[*]} update -qq >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get ${apt_opts[*]} install -y -qq ${missing[*]} >/dev/null" ||
        { echo "otp-root: could not install ${missing[*]} into $suite" >&2; exit 1; }
    for p in "${missing[@]}"; do touch "$root/.beamdiag-pkg-$p"; done
fi
echo "$root"
