#!/usr/bin/env bash
# Deploy Settle to Azure with the Azure CLI: infrastructure (infra/main.bicep) and then the code.
#
#   infra/deploy.sh <resource-group> <location> [environment-name]
#
# Prerequisites: Azure CLI 2.60+ logged in (`az login`, `az account set -s <subscription>`), rights to
# create resources and role assignments in the resource group (Owner, or Contributor + User Access
# Administrator), and a region that offers Flex Consumption (`az functionapp list-flexconsumption-locations`).
# The Azure CLI fetches the Bicep compiler itself on first use.
#
# Options (environment variables):
#   SETTLE_DEVELOPER_ACCESS=1  also grant the signed-in user table and Service Bus data access (local runs)
#   SETTLE_SKIP_WHAT_IF=1      skip the what-if preview (e.g. in a pipeline that already reviewed it)
#   SETTLE_SKIP_CODE=1         deploy the infrastructure only
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  echo "usage: $0 <resource-group> <location> [environment-name]" >&2
  exit 2
fi
rg=$1
location=$2
env_name=${3:-dev}

params=(--template-file infra/main.bicep --parameters infra/main.parameters.json --parameters "environmentName=$env_name")
if [ "${SETTLE_DEVELOPER_ACCESS:-0}" = 1 ]; then
  params+=(--parameters "developerPrincipalId=$(az ad signed-in-user show --query id -o tsv)")
fi

# 1. The resource group that holds everything (idempotent: an existing group is left as it is).
az group create --name "$rg" --location "$location" --output none

# 2. Preview what the deployment would create, change or delete, without changing anything. Review it
#    the first time and whenever infra/ changed.
if [ "${SETTLE_SKIP_WHAT_IF:-0}" != 1 ]; then
  az deployment group what-if --resource-group "$rg" --name settle "${params[@]}"
fi

# 3. Create or update every resource (incremental mode: resources not in the template are left alone).
#    The outputs name the app and the endpoints the code is configured with.
az deployment group create --resource-group "$rg" --name settle "${params[@]}" --output none
app=$(az deployment group show --resource-group "$rg" --name settle --query properties.outputs.functionAppName.value -o tsv)
url=$(az deployment group show --resource-group "$rg" --name settle --query properties.outputs.functionAppUrl.value -o tsv)

if [ "${SETTLE_SKIP_CODE:-0}" = 1 ]; then
  echo "infrastructure deployed: $app ($url); code not deployed (SETTLE_SKIP_CODE=1)"
  exit 0
fi

# 4. Deploy the code. The package holds only what the app runs (the same files .funcignore keeps); the
#    remote build installs requirements.txt on Linux for the app's Python (3.11), so nothing is built here.
#    Flex takes the package into its deployment container with the app's managed identity; basic-auth
#    publishing is off, so the CLI authenticates with your Entra token. A role assignment made a moment
#    ago can take a few minutes to reach the storage service, hence the retries.
package=$(mktemp -d)/settle.zip
python3 - "$package" <<'PY'
import pathlib, sys, zipfile
keep = ["function_app.py", "host.json", "requirements.txt", "common", "state", "handoff"]
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_DEFLATED) as zf:
    for name in keep:
        path = pathlib.Path(name)
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" not in f.parts and f.suffix != ".pyc":
                zf.write(f, f.as_posix())
PY
for attempt in 1 2 3 4 5; do
  if az functionapp deployment source config-zip --resource-group "$rg" --name "$app" \
      --src "$package" --build-remote true --output none; then
    break
  fi
  if [ "$attempt" = 5 ]; then
    echo "code deployment failed 5 times" >&2
    exit 1
  fi
  echo "code deployment failed (attempt $attempt); retrying in 60 s (role assignments may still be propagating)" >&2
  sleep 60
done
# Equivalent with Azure Functions Core Tools installed: func azure functionapp publish "$app" --python
# (never with --publish-local-settings: it would push FUNCTIONS_WORKER_RUNTIME, which Flex rejects).

echo "Settle is deployed: $url/api/v1/"
echo "function key: az functionapp keys list -g $rg -n $app --query functionKeys.default -o tsv"
