#!/usr/bin/env bash
# Idempotent set-up: system packages, the Python environment (.venv) and npm tools.
# Safe to run again; it skips work whose inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
export UV_PYTHON_DOWNLOADS=never PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

# 1. System packages (Debian): listed one per line in scripts/apt-packages.txt, each "command package".
if [ -f scripts/apt-packages.txt ]; then
  missing=()
  while read -r cmd pkg; do
    [ -z "${cmd:-}" ] || [ "${cmd#\#}" != "$cmd" ] && continue
    # a command name, or a path that may contain a glob (e.g. any PostgreSQL version's initdb)
    command -v "$cmd" >/dev/null 2>&1 || compgen -G "$cmd" >/dev/null || missing+=("$pkg")
  done < scripts/apt-packages.txt
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      say "installing system packages: ${missing[*]}"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      say "missing system packages (install them with sudo apt-get install ${missing[*]})"; exit 1
    fi
  fi
fi

# 2. Python: .venv with the project and every extra its tests need, at the versions pinned in uv.lock
#    (pyproject.toml keeps ranges for library users; the lock is what the tests passed with).
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { say "Python 3.11+ is required"; exit 1; }
stamp=.venv/.installed-$(cat pyproject.toml uv.lock | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  say "creating .venv from uv.lock with delayed-delivery[dev] (first time: about a minute)"
  "$PY" -m pip --version >/dev/null 2>&1 || { say "pip is missing for $PY"; exit 1; }
  "$PY" -m uv --version >/dev/null 2>&1 || "$PY" -m pip install -q uv
  # --locked: fail if uv.lock no longer matches pyproject.toml (run `uv lock` and commit it), never re-resolve here.
  UV_PROJECT_ENVIRONMENT=.venv "$PY" -m uv sync -q --locked --extra dev --python "$PY"
  rm -f .venv/.installed-*; touch "$stamp"
fi

# 3. npm tools (Azurite, the CDK CLI) when the project pins any.
if [ -f package.json ]; then
  lock=node_modules/.installed-$( (cat package.json; cat package-lock.json 2>/dev/null) | sha1sum | cut -c1-12)
  if [ ! -f "$lock" ]; then
    say "installing npm tools (package.json)"
    if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --silent; else npm install --no-audit --no-fund --silent; fi
    rm -f node_modules/.installed-*; touch "$lock"
  fi
fi
