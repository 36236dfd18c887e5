#!/usr/bin/env bash
# Print the path of a CPython 3.10 interpreter (MegEngine 1.13 has wheels for 3.8-3.10 only).
# Looks where a user's machine would have one: $PYTHON310, python3.10 on PATH, pyenv, uv.
set -u
works() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 10)' >/dev/null 2>&1; }

if works "${PYTHON310:-}"; then echo "$PYTHON310"; exit 0; fi
# A plain python3.10 on PATH (a pyenv shim refuses to run unless 3.10 is selected, so test it).
if command -v python3.10 >/dev/null 2>&1 && works "$(command -v python3.10)"; then
  command -v python3.10; exit 0
fi
if command -v pyenv >/dev/null 2>&1; then
  for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.10(\.[0-9]+)?$' | sort -t. -k3 -n -r); do
    p="$(pyenv root)/versions/$v/bin/python3.10"
    if works "$p"; then echo "$p"; exit 0; fi
  done
fi
if command -v uv >/dev/null 2>&1; then
  p=$(uv python find 3.10 2>/dev/null)
  if works "$p"; then echo "$p"; exit 0; fi
fi
cat >&2 <<'MSG'
error: no CPython 3.10 found. MegEngine 1.13 ships wheels for CPython 3.8-3.10 only.
Install one, then re-run:
  pyenv install 3.10.13        (pyenv)
  uv python install 3.10       (uv)
  apt-get install python3.10 python3.10-venv   (Debian/Ubuntu with deadsnakes)
or point PYTHON310=/path/to/python3.10 at an existing interpreter.
MSG
exit 1
