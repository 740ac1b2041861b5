// Settle: everything it needs in one resource group (deploy with infra/deploy.sh or the README commands).
//
//   identity.bicep     user-assigned managed identity (the only principal the app runs as)
//   monitoring.bicep   Log Analytics + Application Insights, local auth disabled
//   storage.bicep      host storage (+ deployment container) and data storage (+ Settle's tables)
//   servicebus.bicep   namespace (SAS off), Resolver topic/subscription, NimBus endpoint topics
//   rbac.bicep         role assignments of the identity, each on the narrowest scope
//   functionapp.bicep  Flex Consumption plan + Python 3.11 function app + app settings
targetScope = 'resourceGroup'

@description('Short name of this environment (dev, test, prod, ...): lowercase letters, digits and hyphens; part of every resource name.')
@minLength(1)
@maxLength(16)
param environmentName string

@description('Azure region of every resource (must offer Flex Consumption: az functionapp list-flexconsumption-locations).')
param location string = resourceGroup().location

@description('NimBus endpoint ids: each gets its endpoint topic, its subscription and the fan-out to the resolver.')
param endpoints array = [
  'Billing'
]

@description('Prefix of Settle\'s table names (SETTLE_TABLE_PREFIX); letters and digits, starting with a letter.')
@minLength(1)
@maxLength(30)
param tablePrefix string = 'settle'

@description('NCRONTAB (6 fields, UTC) of the state catch-up timer.')
param stateCatchupSchedule string = '0 */1 * * * *'

@description('Run the hand-off timeout sweeper (fails parked rows whose ExpectedBy has passed).')
param handoffSweeperEnabled bool = false

@description('NCRONTAB (6 fields, UTC) of the hand-off timeout sweeper.')
param handoffSweeperSchedule string = '0 */1 * * * *'

@description('Upper bound of instances the function app scales out to.')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 100

@description('Memory per function app instance (MB).')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('Zone-redundant Flex plan (only where the region supports it).')
param zoneRedundant bool = false

@description('Optional object id of a developer (user) to grant table and Service Bus data access; empty for none.')
param developerPrincipalId string = ''

@description('Tags applied to every resource.')
param tags object = {}

// The tables Settle uses, as logical names: the code's Tables.table("<name>") maps each to
// "{SETTLE_TABLE_PREFIX}<name>". This list must equal the *_TABLE constants in state/ and handoff/
// (tests/infra/test_tables.py checks it); the code also creates a missing table on first use.
var settleTables = [
  'state'
  'statelocks'
  'hoevents'
  'hoendpoints'
  'hopoison'
]

var resolverName = 'Resolver'
var resourceToken = toLower(uniqueString(resourceGroup().id, environmentName))
var baseName = 'settle-${environmentName}-${resourceToken}'
var functionAppName = 'func-${baseName}'
var allTags = union(tags, {
  application: 'settle'
  environment: environmentName
})

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    name: 'id-${baseName}'
    location: location
    tags: allTags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: 'log-${baseName}'
    applicationInsightsName: 'appi-${baseName}'
    location: location
    tags: allTags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    hostStorageName: take('sth${resourceToken}', 24)
    dataStorageName: take('std${resourceToken}', 24)
    location: location
    tags: allTags
    // One container per app: two apps sharing one would overwrite each other's package.
    deploymentContainerName: toLower('app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}')
    tableNames: [for t in settleTables: '${tablePrefix}${t}']
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    name: 'sb-${baseName}'
    location: location
    tags: allTags
    endpoints: endpoints
    resolverName: resolverName
  }
}

module rbac 'modules/rbac.bicep' = {
  name: 'rbac'
  params: {
    principalId: identity.outputs.principalId
    hostStorageName: storage.outputs.hostStorageName
    dataStorageName: storage.outputs.dataStorageName
    serviceBusNamespaceName: serviceBus.outputs.namespaceName
    resolverTopicName: serviceBus.outputs.resolverTopicName
    resolverSubscriptionName: serviceBus.outputs.resolverSubscriptionName
    endpointTopicNames: serviceBus.outputs.endpointTopicNames
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    developerPrincipalId: developerPrincipalId
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  params: {
    name: functionAppName
    planName: 'plan-${baseName}'
    location: location
    tags: allTags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    hostBlobEndpoint: storage.outputs.hostBlobEndpoint
    deploymentContainerName: storage.outputs.deploymentContainerName
    tableEndpoint: storage.outputs.tableEndpoint
    tablePrefix: tablePrefix
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    resolverTopicName: serviceBus.outputs.resolverTopicName
    resolverSubscriptionName: serviceBus.outputs.resolverSubscriptionName
    applicationInsightsConnectionString: monitoring.outputs.applicationInsightsConnectionString
    stateCatchupSchedule: stateCatchupSchedule
    handoffSweeperEnabled: handoffSweeperEnabled
    handoffSweeperSchedule: handoffSweeperSchedule
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    zoneRedundant: zoneRedundant
  }
  // Start the app only once its identity holds its roles (storage, tables, bus, telemetry).
  dependsOn: [
    rbac
  ]
}

output functionAppName string = functionApp.outputs.name
output functionAppUrl string = 'https://${functionApp.outputs.defaultHostName}'
output tableEndpoint string = storage.outputs.tableEndpoint
output tableNames array = [for t in settleTables: '${tablePrefix}${t}']
output serviceBusNamespace string = serviceBus.outputs.namespaceName
output serviceBusFullyQualifiedNamespace string = serviceBus.outputs.fullyQualifiedNamespace
output identityClientId string = identity.outputs.clientId
output deploymentContainerName string = storage.outputs.deploymentContainerName
