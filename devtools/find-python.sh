#!/usr/bin/env bash
# Print the path of a Python 3.13 interpreter (the version Settle runs on in Azure), or say how to get one.
# Looked for, in order: $PYTHON, python3.13 and python3 on the PATH, pyenv, uv, asdf, then the usual
# install folders. Each candidate is run: a pyenv shim that is not selected, or another version, is skipped.
#
# `find-python.sh --check PYTHON` instead says whether PYTHON is a 3.13 and, when it is not, which Python it
# is and how to point PYTHON at a 3.13 (make install runs it before it creates anything).
set -u
want=3.13
works() { [ -n "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info[:2] != (3, 13))" >/dev/null 2>&1; }
if [ "${1:-}" = "--check" ]; then
  given=${2:-}
  works "$given" && exit 0
  found=$("$given" --version 2>&1) && [ "${found#Python }" != "$found" ] || found="not a Python that runs"
  other=$(PYTHON= "$0" 2>/dev/null) && hint=" ($other is one)" || hint=" (pyenv install $want, uv python install $want, or your package manager)"
  echo "PYTHON=$given is $found, not $want: Settle runs on Python $want (what Azure runs). Nothing was created." >&2
  echo "Point PYTHON at a Python $want: make install PYTHON=/path/to/python$want$hint, or unset PYTHON to let make find one." >&2
  exit 1
fi
candidates=("${PYTHON:-}" "$(command -v python$want 2>/dev/null)" "$(command -v python3 2>/dev/null)")
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root 2>/dev/null)
  for version in $(pyenv versions --bare 2>/dev/null | grep -E "^$want(\.[0-9]+)?$" | sort -rV); do
    candidates+=("$root/versions/$version/bin/python$want")
  done
fi
command -v uv >/dev/null 2>&1 && candidates+=("$(uv python find "$want" 2>/dev/null)")
command -v asdf >/dev/null 2>&1 && candidates+=("$(asdf where python 2>/dev/null)/bin/python$want")
candidates+=(/usr/local/bin/python$want /usr/bin/python$want /opt/homebrew/bin/python$want)
for candidate in "${candidates[@]}"; do
  if works "$candidate"; then
    echo "$candidate"
    exit 0
  fi
done
echo "no Python $want found: install it (pyenv install $want, uv python install $want, or your package manager) or set PYTHON=/path/to/python$want" >&2
exit 1
