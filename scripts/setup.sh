#!/usr/bin/env bash
# Installs what beamdiag's build, tests and demo need, from Debian's packages.
# As root it installs what is missing; otherwise it prints the exact command.
# Usage: scripts/setup.sh [build|test|demo]
set -euo pipefail
what=${1:-build}

need_cmd() { command -v "$1" >/dev/null 2>&1; }
have_erl_app() { erl -noshell -eval "case code:lib_dir($1) of {error,_} -> halt(1); _ -> halt(0) end." >/dev/null 2>&1; }

pkgs=()
need_cmd erl || pkgs+=(erlang-nox erlang-dev)
need_cmd rebar3 || pkgs+=(rebar3)
if [ "$what" != build ]; then
    have_erl_app common_test || pkgs+=(erlang-common-test)
    have_erl_app runtime_tools || pkgs+=(erlang-runtime-tools)
    need_cmd perf || pkgs+=(linux-perf)
fi
if [ "$what" = test ]; then
    have_erl_app dialyzer || pkgs+=(erlang-dialyzer)
    need_cmd redis-server || pkgs+=(redis-server)
    need_cmd chromium || pkgs+=(chromium)
    need_cmd tmux || pkgs+=(tmux)
    need_cmd elixir || pkgs+=(elixir)
    # Real servers for beamdiag_servers_SUITE (scripts/rabbitmq-lab.sh,
    # scripts/yaws-lab.sh).
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || pkgs+=(rabbitmq-server)
    [ -d /usr/lib/yaws/ebin ] || pkgs+=(yaws)
    need_cmd npm || pkgs+=(npm)
    # Roots with OTP 27 and 29 for the version matrix (scripts/otp-root.sh).
    need_cmd debootstrap || pkgs+=(debootstrap)
    # Building the lock-counting emulator from Debian's source package.
    need_cmd dpkg-source || pkgs+=(dpkg-dev)
    need_cmd gcc || pkgs+=(build-essential)
    dpkg -s libncurses-dev >/dev/null 2>&1 || pkgs+=(libncurses-dev)
fi

# Debian starts a service when it installs it: the suites start their own
# private RabbitMQ and Yaws nodes when they need them, so the packaged
# services are stopped and kept from starting at boot.
quiet_services() {
    [ "$what" = test ] || return 0
    [ "$(id -u)" -eq 0 ] || return 0
    local svc
    for svc in rabbitmq-server yaws; do
        [ -x "/etc/init.d/$svc" ] || continue
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            systemctl disable --now "$svc" >/dev/null 2>&1 || true
        else
            invoke-rc.d "$svc" stop >/dev/null 2>&1 || true
            update-rc.d "$svc" disable >/dev/null 2>&1 || true
        fi
    done
}

install_npm_tools() {
    # speedscope, to check that folded stacks load in a standard viewer.
    [ "$what" = test ] || return 0
    local dir="${BEAMDIAG_CACHE:-/var/cache/beamdiag}/npm"
    [ -f "$dir/node_modules/speedscope/dist/release/index.html" ] && return 0
    if ! command -v npm >/dev/null 2>&1; then
        echo "setup: npm is missing; the folded-stack viewer test will fail (install nodejs and npm)" >&2
        return 0
    fi
    mkdir -p "$dir" && (cd "$dir" && npm install --silent --no-audit --no-fund speedscope@1.25.0 >/dev/null 2>&1) ||
        echo "setup: could not install speedscope with npm" >&2
}

install_lint_tools() {
    # eslint and stylelint, for the HTML report's script and style sheet
    # (scripts/lint-assets.sh, in make check).
    [ "$what" = test ] || return 0
    local dir="${BEAMDIAG_CACHE:-/var/cache/beamdiag}/npm-lint"
    [ -x "$dir/node_modules/.bin/eslint" ] && [ -x "$dir/node_modules/.bin/stylelint" ] && return 0
    if ! command -v npm >/dev/null 2>&1; then
        echo "setup: npm is missing; make check cannot lint the report's assets" >&2
        return 0
    fi
    mkdir -p "$dir" && (cd "$dir" && npm install --silent --no-audit --no-fund eslint@8.57.0 \
        stylelint@16.10.0 stylelint-config-recommended@14.0.1 >/dev/null 2>&1) ||
        echo "setup: could not install eslint and stylelint with npm" >&2
}

if [ ${#pkgs[@]} -eq 0 ]; then
    install_npm_tools
    install_lint_tools
    quiet_services
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "beamdiag needs: ${pkgs[*]}" >&2
    echo "run: sudo apt-get update && sudo apt-get install -y --no-install-recommends ${pkgs[*]}" >&2
    exit 1
fi
echo "setup: installing ${pkgs[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
install_npm_tools
install_lint_tools
quiet_services
