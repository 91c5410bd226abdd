#!/usr/bin/env bash
# Runs a command inside a cached OTP root (scripts/otp-root.sh), as a
# container would: its own mount namespace with /proc, /sys, /dev and a
# private /tmp mounted inside it, so nothing stays mounted once the command
# exits. The network and the PIDs are the host's, so nodes inside reach and
# are reached over loopback, and perf on the host sees them.
#   scripts/otp-run.sh SUITE COMMAND [ARG...]
# e.g. scripts/otp-run.sh sid erl -sname otp29 -setcookie c -noinput
# OTP_RUN_BIND="HOSTDIR:DIR ..." also mounts each host folder at DIR inside
# the root for the command's lifetime (paths without spaces).
set -euo pipefail
suite=${1:?usage: scripts/otp-run.sh SUITE COMMAND [ARG...]}
shift
[ $# -gt 0 ] || { echo "usage: scripts/otp-run.sh SUITE COMMAND [ARG...]" >&2; exit 2; }
root=${BEAMDIAG_CACHE:-/var/cache/beamdiag}/roots/$suite
[ -f "$root/.beamdiag-ready" ] || root=$("$(dirname "$0")/otp-root.sh" "$suite")
exec unshare --mount --propagation private -- /bin/sh -c '
    r=$1; binds=$2; shift 2
    mount -t proc proc "$r/proc" &&
    mount --rbind /sys "$r/sys" &&
    mount --rbind /dev "$r/dev" &&
    mount -t tmpfs -o mode=1777 tmpfs "$r/tmp" &&
    mount --bind /etc/hosts "$r/etc/hosts" || exit 125
    for b in $binds; do
        mkdir -p "$r${b#*:}" && mount --bind "${b%%:*}" "$r${b#*:}" || exit 125
    done
    exec chroot "$r" /usr/bin/env HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
' otp-run "$root" "${OTP_RUN_BIND:-}" "$@"
