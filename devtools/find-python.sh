#!/usr/bin/env bash
# Print the path of a Python 3.13 interpreter (the version Settle runs on in Azure), or say how to get one.
# Looked for, in order: $PYTHON, python3.13 and python3 on the PATH, pyenv, uv, asdf, then the usual
# install folders. Each candidate is run: a pyenv shim that is not selected, or another version, is skipped.
set -u
want=3.13
works() { [ -n "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info[:2] != (3, 13))" >/dev/null 2>&1; }
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
