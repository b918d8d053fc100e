#!/usr/bin/env bash
# Idempotent set-up of LocalStack's own environment (.localstack) from scripts/localstack/uv.lock.
# LocalStack needs Python 3.12 or 3.13; the project's .venv may be 3.11, so the lane has an interpreter of its own,
# found on this machine (uv never downloads one here: UV_PYTHON_DOWNLOADS=never), in this order:
#   $LOCALSTACK_PYTHON; python3.13 / python3.12 on PATH; pyenv's versions; /usr/bin and /usr/local/bin;
#   then Debian's python3.13 / python3.12 package when apt has one (Debian 13 does; Debian 12 does not).
# Prints the environment's python on stdout; exits 1 with one line when no interpreter can be had.
set -euo pipefail
cd "$(dirname "$0")/../.."
export UV_PYTHON_DOWNLOADS=never PIP_DISABLE_PIP_VERSION_CHECK=1
ENV_DIR=${LOCALSTACK_ENV:-.localstack}
say() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

usable() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(not ((3, 12) <= sys.version_info[:2] <= (3, 13)))' 2>/dev/null; }

find_python() {
  local c
  if [ -n "${LOCALSTACK_PYTHON:-}" ]; then usable "$LOCALSTACK_PYTHON" && { echo "$LOCALSTACK_PYTHON"; return; }; fi
  for c in python3.13 python3.12; do
    usable "$c" && { command -v "$c"; return; }
  done
  for c in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3 \
           /usr/local/bin/python3.13 /usr/local/bin/python3.12 /usr/bin/python3.13 /usr/bin/python3.12; do
    usable "$c" && { echo "$c"; return; }
  done
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    for c in python3.13 python3.12; do
      if apt-cache policy "$c" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        say "installing $c from Debian for LocalStack"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$c" "$c-venv" >/dev/null && usable "/usr/bin/$c" && { echo "/usr/bin/$c"; return; }
      fi
    done
  fi
  return 1
}

stamp="$ENV_DIR/.installed-$(cat scripts/localstack/pyproject.toml scripts/localstack/uv.lock | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ] || ! usable "$ENV_DIR/bin/python"; then
  py=$(find_python) || { say "LocalStack needs Python 3.12 or 3.13 and none was found (set LOCALSTACK_PYTHON)"; exit 1; }
  say "creating $ENV_DIR for LocalStack from scripts/localstack/uv.lock with $py ($("$py" -V 2>&1))"
  UV=(python3 -m uv)
  "${UV[@]}" --version >/dev/null 2>&1 || UV=(.venv/bin/python -m uv)
  "${UV[@]}" --version >/dev/null 2>&1 || { python3 -m pip install -q uv; UV=(python3 -m uv); }
  # --locked: fail if uv.lock no longer matches pyproject.toml (run `uv lock` there and commit it), never re-resolve.
  UV_PROJECT_ENVIRONMENT="$PWD/$ENV_DIR" "${UV[@]}" sync -q --locked --project scripts/localstack --python "$py"
  rm -f "$ENV_DIR"/.installed-*; touch "$stamp"
fi
echo "$PWD/$ENV_DIR/bin/python"
