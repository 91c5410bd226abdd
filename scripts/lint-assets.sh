#!/usr/bin/env bash
# Lints the HTML report's script and style sheet (priv/report.js,
# priv/report.css): node's syntax check, then eslint and stylelint, which
# scripts/setup.sh test installs from npm under ${BEAMDIAG_CACHE:-/var/cache/beamdiag}/npm-lint.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${BEAMDIAG_CACHE:-/var/cache/beamdiag}/npm-lint"
bin="$dir/node_modules/.bin"
if ! command -v node >/dev/null 2>&1; then
    echo "lint-assets: node is missing (scripts/setup.sh test installs it)" >&2
    exit 1
fi
node --check priv/report.js
if [ ! -x "$bin/eslint" ] || [ ! -x "$bin/stylelint" ]; then
    echo "lint-assets: eslint or stylelint is missing under $dir (scripts/setup.sh test installs them)" >&2
    exit 1
fi
"$bin/eslint" --no-eslintrc -c scripts/eslintrc.json priv/report.js
"$bin/stylelint" --config scripts/stylelintrc.json --config-basedir "$dir" priv/report.css
echo "lint-assets: priv/report.js and priv/report.css pass node --check, eslint and stylelint"
