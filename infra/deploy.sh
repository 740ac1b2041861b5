#!/usr/bin/env bash
# Deploy Settle to Azure with the Azure CLI: infrastructure (infra/main.bicep), then the code.
#
#   infra/deploy.sh [--what-if | --yes] <resource-group> <location> [environment-name] [name=value ...]
#
#   (neither)   show what would change and ask before changing anything (needs a terminal); any
#               answer but yes stops with nothing deployed (exit 1)
#   --what-if   show what would change and stop (nothing is created or changed)
#   --yes       deploy without asking (pipelines: review the --what-if of the same commit first)
#   name=value  any main.bicep parameter, e.g. alertEmail=ops@example.com,
#               serviceBusNamespaceName=nimbus-prod serviceBusResourceGroupName=rg-nimbus
#               createResolverTopic=false createEndpointTopics=false  (attach to a NimBus namespace)
#
# Prerequisites: Azure CLI 2.60.0 or newer (checked below), logged in as a user (`az login`) or as a
# service principal (`az login --service-principal ...`, as in a pipeline), `az account set -s <sub>`,
# rights to create resources and role assignments in the resource group (Owner, or Contributor + User
# Access Administrator; the data account's lock needs Microsoft.Authorization/locks/write: README, "What
# the deploying principal needs"), python3 (packages the code), and a region that offers Flex Consumption
# (`az functionapp list-flexconsumption-locations`). The Azure CLI fetches the Bicep compiler itself.
#
# Options (environment variables):
#   SETTLE_DEVELOPER_ACCESS=1  also grant the signed-in user or service principal table and Service Bus
#                              data access (local runs, integration tests)
#   SETTLE_SKIP_CODE=1         deploy the infrastructure only
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [--what-if | --yes] <resource-group> <location> [environment-name] [name=value ...]" >&2
  exit 2
}

mode=confirm
case "${1:-}" in
  --yes) mode=yes; shift ;;
  --what-if) mode=what-if; shift ;;
  -*) usage ;;
esac
[ $# -ge 2 ] || usage
rg=$1
location=$2
shift 2
env_name=dev
if [ $# -gt 0 ] && [[ $1 != *=* ]]; then
  env_name=$1
  shift
fi
# The environment name is part of resource names: refuse a bad one before anything is asked or created.
bash infra/environment-name.sh "$env_name"
if [ "$mode" = confirm ] && ! [ -t 0 ]; then
  echo "no terminal to confirm on: pass --what-if to preview or --yes to deploy" >&2
  exit 2
fi

# 1. The tools and the login this script relies on.
required_cli=2.60.0 # Flex Consumption support in the Azure CLI (Microsoft's Flex how-to names 2.60.0)
cli=$(az version --query '"azure-cli"' -o tsv)
if ! python3 -c 'import sys; v = lambda s: tuple(int(p) for p in s.split(".")[:3]); sys.exit(v(sys.argv[1]) < v(sys.argv[2]))' "$cli" "$required_cli"; then
  echo "Azure CLI $cli is older than $required_cli: run az upgrade" >&2
  exit 1
fi
account_type=$(az account show --query user.type -o tsv) || {
  echo "not logged in: az login (or az login --service-principal ...)" >&2
  exit 1
}

params=(--template-file infra/main.bicep --parameters infra/main.parameters.json --parameters "environmentName=$env_name")
if [ "${SETTLE_DEVELOPER_ACCESS:-0}" = 1 ]; then
  # The object id of whoever is logged in, user or service principal, read from the token's oid claim
  # (no Microsoft Graph call, which a pipeline's service principal is often not allowed to make).
  principal_id=$(az account get-access-token --query accessToken -o tsv | python3 -c '
import base64, json, sys
claims = sys.stdin.read().strip().split(".")[1]
print(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["oid"])')
  case "$account_type" in
    user) principal_type=User ;;
    servicePrincipal) principal_type=ServicePrincipal ;;
    *) echo "unknown account type $account_type" >&2; exit 1 ;;
  esac
  params+=(--parameters "developerPrincipalId=$principal_id" "developerPrincipalType=$principal_type")
fi
for assignment in "$@"; do
  [[ $assignment == *=* ]] || usage
  params+=(--parameters "$assignment")
done

# 2. What the deployment would create, change or delete (what-if needs the resource group to exist).
#    --what-if stops here; without --yes, nothing changes until the answer is yes (Azure CLI's own
#    --confirm-with-what-if is not used: when declined it exits 0, and the code would still be pushed).
group_exists=$(az group exists --name "$rg")
# A resource group keeps the location it was created in; a different <location> would be ignored silently
# (everything follows the group's location), so stop and say which one it is.
if [ "$group_exists" = true ]; then
  group_location=$(az group show --name "$rg" --query location -o tsv)
  normalise() { tr '[:upper:]' '[:lower:]' <<<"$1" | tr -d ' '; }
  if [ "$(normalise "$group_location")" != "$(normalise "$location")" ]; then
    echo "resource group $rg is in $group_location, not $location: pass $group_location as the location," \
      "or name another resource group; nothing was deployed" >&2
    exit 1
  fi
fi
# Each deployment gets its own name, so two deploys never collide and the group keeps the history; the
# outputs below are read from this deployment, not from whichever ran last.
deployment="settle-$(date -u +%Y%m%d-%H%M%S)-$(printf '%04x' $((RANDOM % 65536)))"
if [ "$mode" != yes ]; then
  if [ "$group_exists" = true ]; then
    az deployment group what-if --resource-group "$rg" --name "$deployment" "${params[@]}"
  else
    echo "resource group $rg does not exist yet: it and everything in infra/main.bicep would be created" >&2
  fi
  if [ "$mode" = what-if ]; then
    exit 0
  fi
  answer=
  read -r -p "Deploy this to resource group $rg (infrastructure, then code)? [y/N] " answer || true
  case "$answer" in
    y | Y | yes | Yes | YES) ;;
    *)
      echo "nothing was deployed" >&2
      exit 1
      ;;
  esac
fi

# 3. The resource group that holds everything, created only if it is missing (`az group create` on an
#    existing group replaces its tags with none), then the deployment in incremental mode (resources not
#    in the template are left alone).
if [ "$group_exists" != true ]; then
  az group create --name "$rg" --location "$location" --output none
fi
echo "deployment $deployment in resource group $rg ($location)"
az deployment group create --resource-group "$rg" --name "$deployment" "${params[@]}" --output none
app=$(az deployment group show --resource-group "$rg" --name "$deployment" --query properties.outputs.functionAppName.value -o tsv)
url=$(az deployment group show --resource-group "$rg" --name "$deployment" --query properties.outputs.functionAppUrl.value -o tsv)
# Settlement may send only to the listed endpoints (Data Sender per endpoint topic): say which.
settles_to=$(az deployment group show --resource-group "$rg" --name "$deployment" --query properties.outputs.settlementEndpoints.value -o tsv | tr '\n' ' ')
settles_to=${settles_to% }
echo "settlement may send to these endpoints only: ${settles_to:-none} (any other is refused by Service Bus: add it to the endpoints parameter and redeploy)"

if [ "${SETTLE_SKIP_CODE:-0}" = 1 ]; then
  echo "infrastructure deployed: $app ($url); code not deployed (SETTLE_SKIP_CODE=1)"
  exit 0
fi

# 4. Deploy the code: the package holds what .funcignore keeps (the list func and azd use too) and the
#    app's bytecode for Python 3.13 (infra/package.py: a read-only package would otherwise compile every
#    module at each cold start); the remote build installs requirements.txt on Linux for the app's Python,
#    so no dependency is built here. Flex takes the package into its deployment container with the app's managed identity; basic-auth
#    publishing is off, so the CLI authenticates with your Entra token. A role assignment made a moment
#    ago can take a few minutes to reach the storage service, hence the retries.
package=$(mktemp -d)/settle.zip
# The app's Python writes its bytecode; another python3 ships sources only (package.py says so).
"$(bash devtools/find-python.sh 2>/dev/null || command -v python3)" infra/package.py "$package"
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
