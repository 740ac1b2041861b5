#!/usr/bin/env bash
# Check an environment name before anything is created (infra/deploy.sh and azd's preprovision hook run
# this; main.bicep itself can only bound its length). The name is part of resource names, the deployment
# container's name and tags, where an upper-case letter, an underscore or a hyphen at an end or next to
# another one fails part-way through a deployment (`Prod_EU`, `dev-`).
#
#   infra/environment-name.sh NAME     exit 0 if NAME is valid, else print why and exit 2
set -euo pipefail
name=${1-}
if ! [[ $name =~ ^[a-z][a-z0-9]*(-[a-z0-9]+)*$ ]] || [ ${#name} -gt 16 ]; then
  echo "invalid environment name '$name': 1-16 lowercase letters, digits and single hyphens, starting with a letter, not ending with a hyphen (e.g. dev, prod, test-eu1)" >&2
  exit 2
fi
