// The Flex Consumption (FC1) Linux plan and the Python function app.
//
// Flex specifics (shared/reference/azure-practice.md §1, §6):
// - runtime, scaling and the deployment package live in `functionAppConfig`, not in app settings, so
//   FUNCTIONS_WORKER_RUNTIME, WEBSITE_RUN_FROM_PACKAGE, WEBSITE_CONTENT*, SCM_DO_BUILD_DURING_DEPLOYMENT,
//   ENABLE_ORYX_BUILD and FUNCTIONS_EXTENSION_VERSION are not set (Flex rejects or ignores them), nor are
//   the siteConfig properties Flex does not support (alwaysOn, ftpsState, linuxFxVersion, ...);
// - FTP and basic-auth publishing are switched off with basicPublishingCredentialsPolicies; code is
//   deployed with an Entra token (`az functionapp deployment source config-zip` / `func ... publish`);
// - WEBSITE_TIME_ZONE is not supported: every NCRONTAB schedule below runs in UTC.
//
// Every connection is identity-based through the one user-assigned identity; no app setting holds a key.

@description('Name of the function app.')
param name string

@description('Name of the Flex Consumption plan.')
param planName string

@description('Azure region.')
param location string

@description('Tags applied to the plan and the app.')
param tags object = {}

@description('Resource id of the user-assigned identity.')
param identityId string

@description('Client id of the user-assigned identity.')
param identityClientId string

@description('Blob endpoint of the host storage account (https://<account>.blob.core.windows.net/).')
param hostBlobEndpoint string

@description('Blob container that holds the deployment package.')
param deploymentContainerName string

@description('Table endpoint of the data storage account (https://<account>.table.core.windows.net/).')
param tableEndpoint string

@description('Table endpoints of state accounts 1..N-1 in account order (stateaccounts.bicep); empty with one account.')
param stateTableEndpoints array = []

@description('Prefix of Settle\'s table names (SETTLE_TABLE_PREFIX).')
param tablePrefix string

@description('Host name of the Service Bus namespace.')
param serviceBusFullyQualifiedNamespace string

@description('Resolver topic name (RESOLVER_TOPIC).')
param resolverTopicName string

@description('Resolver subscription name (RESOLVER_SUBSCRIPTION).')
param resolverSubscriptionName string

@description('Whether the endpoint topics drop a repeated MessageId (HANDOFF_DUPLICATE_DETECTION): the same flag that created them with requiresDuplicateDetection.')
param duplicateDetection bool

@description('Application Insights connection string (no secret: local auth is disabled).')
param applicationInsightsConnectionString string

@description('NCRONTAB (6 fields, UTC) of the state catch-up timer.')
param stateCatchupSchedule string

@description('State partitions per node (SETTLE_STATE_SHARDS).')
@minValue(1)
@maxValue(999)
param stateShards int

@description('Earlier state layouts (SETTLE_STATE_SHARDS_PREVIOUS), comma-separated.')
param stateShardsPrevious string

@description('Hand-off partitions per endpoint (SETTLE_HANDOFF_SHARDS).')
@minValue(1)
@maxValue(999)
param handoffShards int

@description('Earlier hand-off layouts (SETTLE_HANDOFF_SHARDS_PREVIOUS), comma-separated.')
param handoffShardsPrevious string

@description('Level-1 pointers one catch-up run works on at once (STATE_CATCHUP_PARALLELISM).')
@minValue(1)
@maxValue(64)
param stateCatchupParallelism int

@description('Whether the hand-off timeout sweeper runs.')
param handoffSweeperEnabled bool

@description('NCRONTAB (6 fields, UTC) of the hand-off timeout sweeper.')
param handoffSweeperSchedule string

@description('Upper bound of instances the app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int

@description('Memory per instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int

@description('Always-ready instances of the HTTP functions (0: scale from zero).')
@minValue(0)
@maxValue(1000)
param httpAlwaysReadyInstances int

@description('Zone-redundant plan (only in regions that support it for Flex Consumption).')
param zoneRedundant bool

@description('Client id of the Entra ID app registration operators sign in to the console with (App Service authentication); empty: no sign-in, and the management API refuses every request (ADR-0013).')
param operatorAppClientId string

@description('Entra ID tenant of that app registration.')
param operatorTenantId string

// The complete set of app settings (siteConfig.appSettings replaces the whole collection on every
// deployment). tests/infra/test_app_settings.py checks that every setting the code reads is here.
var appSettings = {
  // Host storage (leases, timer schedule monitor) through the identity; blob is the only service used.
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  AzureWebJobsStorage__blobServiceUri: hostBlobEndpoint
  // Telemetry, authenticated with Entra (Monitoring Metrics Publisher on the component).
  APPLICATIONINSIGHTS_CONNECTION_STRING: applicationInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  // No PYTHON_ENABLE_OPENTELEMETRY: Settle parents its spans on context.trace_context itself, and with it the
  // worker would set up Azure Monitor a second time and log an error at start (docs/observability.md).
  // SDK clients in code (DefaultAzureCredential / ManagedIdentityCredential) use this identity.
  AZURE_CLIENT_ID: identityClientId
  // Settle's tables (common/settings.py): endpoint + identity, never a connection string.
  SETTLE_TABLES__tableServiceUri: tableEndpoint
  SETTLE_TABLES__clientId: identityClientId
  SETTLE_TABLE_PREFIX: tablePrefix
  // Service Bus: the trigger's connection="ServiceBusConnection" and the settlement sender.
  // __credential and __clientId are needed for the scale controller to wake the app from zero.
  ServiceBusConnection__fullyQualifiedNamespace: serviceBusFullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identityClientId
  RESOLVER_TOPIC: resolverTopicName
  RESOLVER_SUBSCRIPTION: resolverSubscriptionName
  // Whether the endpoint topics drop a repeated MessageId (only topics Settle created can).
  HANDOFF_DUPLICATE_DETECTION: duplicateDetection ? 'true' : 'false'
  // Settlement sends control messages to Service Bus (loopback is a local-development shortcut).
  SETTLE_LOOPBACK: 'false'
  STATE_CATCHUP_SCHEDULE: stateCatchupSchedule
  // State layout (ADR-0015). Set here, never by hand: appSettings replaces the whole collection on every
  // deployment, and a shard count dropped by a redeploy would hide every record written under it.
  SETTLE_STATE_SHARDS: string(stateShards)
  SETTLE_STATE_SHARDS_PREVIOUS: stateShardsPrevious
  STATE_CATCHUP_PARALLELISM: string(stateCatchupParallelism)
  SETTLE_HANDOFF_SHARDS: string(handoffShards)
  SETTLE_HANDOFF_SHARDS_PREVIOUS: handoffShardsPrevious
  HANDOFF_SWEEPER_ENABLED: handoffSweeperEnabled ? 'true' : 'false'
  HANDOFF_SWEEPER_SCHEDULE: handoffSweeperSchedule
  // The management API and the console demand a signed-in principal (App Service authentication) with
  // the app role Settle.Operator. Without an app registration nothing strips caller-sent principal
  // headers, so the code refuses every management request ('disabled'; also its default in Azure).
  SETTLE_OPERATOR_AUTH: empty(operatorAppClientId) ? 'disabled' : 'required'
}

var namedSettings = [
  for setting in items(appSettings): {
    name: setting.key
    value: setting.value
  }
]

// State accounts 1..N-1 (ADR-0015): SETTLE_TABLES_{i}__tableServiceUri for i = 1..N-1, each reached with
// the same identity (the code falls back to SETTLE_TABLES__clientId). Account 0 is SETTLE_TABLES__* above.
var stateAccountSettings = [
  for (endpoint, i) in stateTableEndpoints: {
    name: 'SETTLE_TABLES_${i + 1}__tableServiceUri'
    value: endpoint
  }
]

// "http" is the Flex function group of every HTTP-triggered function (Flex "always ready" instances).
var alwaysReadyHttp = [
  {
    name: 'http'
    instanceCount: httpAlwaysReadyInstances
  }
]

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
    zoneRedundant: zoneRedundant
  }
}

resource site 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  // azd deploys the code of service "api" (azure.yaml) to the resource carrying this tag.
  tags: union(tags, {
    'azd-service-name': 'api'
  })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    publicNetworkAccess: 'Enabled'
    siteConfig: {
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      http20Enabled: true
      remoteDebuggingEnabled: false
      appSettings: concat(namedSettings, stateAccountSettings)
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${hostBlobEndpoint}${deploymentContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
        alwaysReady: httpAlwaysReadyInstances > 0 ? alwaysReadyHttp : []
      }
      // Must equal the Python CI runs (pyproject requires-python); tests/infra asserts it.
      runtime: {
        name: 'python'
        version: '3.13'
      }
    }
  }
}

// FTP and basic-auth (SCM) publishing off: deployments authenticate with Entra ID only.
resource ftpPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmPublishing 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: site
  name: 'scm'
  properties: {
    allow: false
  }
}

// App Service authentication (Entra ID) for the console and the management API (ADR-0013). Requests
// without a session pass through (AllowAnonymous): the machine APIs keep their function keys, and the
// management routes, anonymous for the Functions host, refuse a request without a principal (401) or
// without the app role Settle.Operator (403) in code. App Service strips client-sent x-ms-client-principal*
// headers, so the principal the code reads is the one it authenticated.
resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (!empty(operatorAppClientId)) {
  parent: site
  name: 'authsettingsV2'
  properties: {
    platform: {
      enabled: true
    }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    httpSettings: {
      requireHttps: true
    }
    // No token store: the code reads the principal App Service puts in x-ms-client-principal on each
    // request and never a stored token (/.auth/me, refresh); the default store is the app's file system,
    // and a blob-backed one would need a SAS URL in a setting (this template holds no secret).
    login: {
      tokenStore: {
        enabled: false
      }
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: operatorAppClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${operatorTenantId}/v2.0'
        }
        validation: {
          allowedAudiences: [
            'api://${operatorAppClientId}'
            operatorAppClientId
          ]
        }
      }
    }
  }
}

output name string = site.name
output defaultHostName string = site.properties.defaultHostName
