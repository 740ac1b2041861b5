// Settle: everything it needs in one resource group (deploy with infra/deploy.sh, azd up, or the README
// commands); Service Bus may be an existing (NimBus) namespace in this or another resource group.
//
//   identity.bicep              user-assigned managed identity (the only principal the app runs as)
//   monitoring.bicep            Log Analytics + Application Insights, local auth disabled
//   storage.bicep               host storage (+ deployment container) and data storage (+ Settle's tables),
//                               their diagnostic settings and the data account's delete lock
//   stateaccounts.bicep         state accounts 1..N-1 (stateAccounts > 1): more accounts for the state table
//   servicebus-namespace.bicep  a new namespace (SAS off), unless an existing one is attached
//   servicebus.bicep            Resolver topic/subscription, NimBus endpoint topics, diagnostic settings
//   servicebus-rbac.bicep       the identity's Service Bus roles (in the namespace's resource group)
//   rbac.bicep                  the identity's storage (state accounts too) and telemetry roles
//   functionapp.bicep           Flex Consumption plan + Python 3.13 function app + app settings
//   alerts.bicep                dead letters on the resolver, function failures, Service Bus throttling,
//                               and Settle's own signals (poison, expired locks, overdue hand-offs, 503s)
//   workbook.bicep              the operations Workbook (infra/workbooks/) on the Log Analytics workspace
//
// Role IDs come from builtin-roles.json (by name); tests/infra type-checks every file against Azure's
// resource types (tests/infra/bicep-types) because no Bicep compiler runs in CI.
targetScope = 'resourceGroup'

@description('Short name of this environment (dev, test, prod, ...): lowercase letters, digits and hyphens; part of every resource name. Environments whose name starts with "dev" get no delete lock by default.')
@minLength(1)
@maxLength(16)
param environmentName string

@description('Azure region of every resource (must offer Flex Consumption: az functionapp list-flexconsumption-locations).')
param location string = resourceGroup().location

@description('NimBus endpoint ids: each gets its endpoint topic, its subscription and the fan-out to the resolver (unless createEndpointTopics is false), and settlement may send to it.')
param endpoints array = [
  'Billing'
]

@description('Prefix of Settle\'s table names (SETTLE_TABLE_PREFIX); letters and digits, starting with a letter.')
@minLength(1)
@maxLength(30)
param tablePrefix string = 'settle'

@description('NCRONTAB (6 fields, UTC) of the state catch-up timer.')
param stateCatchupSchedule string = '0 */1 * * * *'

@description('State partitions per node (SETTLE_STATE_SHARDS, ADR-0015): 1 keeps one partition per node (~330 items/s each). Changing it on a live deployment needs the old value in stateShardsPrevious.')
@minValue(1)
@maxValue(999)
param stateShards int = 1

@description('Earlier state layouts still holding records (SETTLE_STATE_SHARDS_PREVIOUS): comma-separated S, or S@N for a layout over N accounts; empty when S never changed.')
param stateShardsPrevious string = ''

@description('Hand-off partitions per endpoint (SETTLE_HANDOFF_SHARDS, docs/tables.md "Sharded endpoints"): 1 keeps one partition per endpoint (~40 hand-offs/s). Changing it on a live deployment needs the old value in handoffShardsPrevious.')
@minValue(1)
@maxValue(999)
param handoffShards int = 1

@description('Earlier hand-off layouts still holding rows (SETTLE_HANDOFF_SHARDS_PREVIOUS): comma-separated S; empty when S never changed.')
param handoffShardsPrevious string = ''

@description('Storage accounts Settle\'s state table is spread over (ADR-0015): 1 is the data account alone; N > 1 adds N-1 accounts (stateaccounts.bicep) and puts shard s in account s mod N, so it only helps with stateShards >= N. Fixed once records exist: changing it is a layout change like stateShards (list the earlier layout as S@N in stateShardsPrevious) and an account that holds rows must never be removed.')
@minValue(1)
@maxValue(64)
param stateAccounts int = 1

@description('Level-1 pointers one catch-up run works on at once (STATE_CATCHUP_PARALLELISM, 1-64).')
@minValue(1)
@maxValue(64)
param stateCatchupParallelism int = 8

@description('Client id of the Entra ID app registration operators sign in to the console with; it defines the app role Settle.Operator (ADR-0013). Empty: no sign-in, the management API refuses every request.')
param operatorAppClientId string = ''

@description('Entra ID tenant of the operators\' app registration (default: the deployment\'s tenant).')
param operatorTenantId string = tenant().tenantId

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

@description('Always-ready instances for the HTTP functions (Flex "http" group); 0 scales from zero (cold starts), more are billed while idle.')
@minValue(0)
@maxValue(1000)
param httpAlwaysReadyInstances int = 0

@description('Zone-redundant Flex plan and host storage (Standard_ZRS) (only where the region supports both).')
param zoneRedundant bool = false

@description('Redundancy of the data account (Settle\'s tables): Standard_ZRS, or Standard_LRS in a region without zone-redundant storage.')
@allowed([
  'Standard_ZRS'
  'Standard_LRS'
])
param dataStorageSku string = 'Standard_ZRS'

@description('Put a CanNotDelete lock on the data account (Settle\'s state and history). Remove the lock before deleting the environment.')
param lockDataAccount bool = !startsWith(environmentName, 'dev')

@description('Existing Service Bus namespace to attach to (e.g. the NimBus one); empty creates a new namespace.')
param serviceBusNamespaceName string = ''

@description('Resource group of the existing namespace (same subscription); empty means this resource group.')
param serviceBusResourceGroupName string = ''

@description('Create the Resolver topic and its session-enabled subscription; false when they exist already (a NimBus namespace).')
param createResolverTopic bool = true

@description('Create the endpoint topics, their subscriptions and the fan-out rules; false when NimBus created them already.')
param createEndpointTopics bool = true

@description('Create endpoint topics with duplicate detection (10 minutes), so a settlement retried after an ambiguous send reaches the endpoint once. Service Bus fixes this when a topic is created.')
param endpointDuplicateDetection bool = true

@description('Let the resolver scale by target (its subscription\'s backlog): grants the identity Azure Service Bus Data Owner on the Resolver subscription only (ADR-0014). Off: Data Receiver there, incremental scale-out.')
param resolverTargetBasedScaling bool = false

@description('E-mail address that receives the alerts; empty creates the alerts without an action group.')
param alertEmail string = ''

@description('Optional object id of a developer (user) or pipeline (service principal) to grant table and Service Bus data access; empty for none.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param developerPrincipalType string = 'User'

@description('Tags applied to every resource.')
param tags object = {}

// The tables Settle uses, as logical names: the code's Tables.table("<name>") maps each to
// "{SETTLE_TABLE_PREFIX}<name>". This list must equal the *_TABLE constants of the code package
// (tests/infra/test_tables.py checks it); the code also creates a missing table on first use.
var settleTables = [
  'state'
  'statelocks'
  'hoevents'
  'hoendpoints'
  'hopoison'
  'hoaudit'
  'hoids'
]

var resolverName = 'Resolver'
// Also part of every module deployment's name: two environments in one resource group, or Settle's modules
// deployed into NimBus's resource group (attach mode), never overwrite each other's deployment records.
var resourceToken = toLower(uniqueString(resourceGroup().id, environmentName))
var baseName = 'settle-${environmentName}-${resourceToken}'
var functionAppName = 'func-${baseName}'
var allTags = union(tags, {
  application: 'settle'
  environment: environmentName
})
var createServiceBusNamespace = empty(serviceBusNamespaceName)
var namespaceName = createServiceBusNamespace ? 'sb-${baseName}' : serviceBusNamespaceName
var serviceBusResourceGroup = empty(serviceBusResourceGroupName) ? resourceGroup().name : serviceBusResourceGroupName
// One flag for the topics and for the code (HANDOFF_DUPLICATE_DETECTION): topics Settle attaches to were
// created by NimBus, whose provisioner never enables duplicate detection.
var endpointTopicsDetectDuplicates = createEndpointTopics && endpointDuplicateDetection

module identity 'modules/identity.bicep' = {
  name: 'identity-${resourceToken}'
  params: {
    name: 'id-${baseName}'
    location: location
    tags: allTags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring-${resourceToken}'
  params: {
    logAnalyticsName: 'log-${baseName}'
    applicationInsightsName: 'appi-${baseName}'
    location: location
    tags: allTags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage-${resourceToken}'
  params: {
    hostStorageName: take('sth${resourceToken}', 24)
    dataStorageName: take('std${resourceToken}', 24)
    dataStorageSku: dataStorageSku
    zoneRedundant: zoneRedundant
    lockDataAccount: lockDataAccount
    location: location
    tags: allTags
    // One container per app: two apps sharing one would overwrite each other's package.
    deploymentContainerName: toLower('app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}')
    tableNames: [for t in settleTables: '${tablePrefix}${t}']
    logAnalyticsWorkspaceId: monitoring.outputs.workspaceId
  }
}

// State accounts 1..N-1 (account 0 is the data account above); names differ from the data account's
// ('std' + the token) by the account number after 'std'.
module stateAccountsModule 'modules/stateaccounts.bicep' = {
  name: 'stateaccounts-${resourceToken}'
  params: {
    stateStorageNames: [for i in range(1, stateAccounts - 1): take('std${i}${resourceToken}', 24)]
    dataStorageSku: dataStorageSku
    lockAccounts: lockDataAccount
    location: location
    tags: allTags
    stateTableName: '${tablePrefix}state'
    logAnalyticsWorkspaceId: monitoring.outputs.workspaceId
  }
}

module serviceBusNamespace 'modules/servicebus-namespace.bicep' = if (createServiceBusNamespace) {
  name: 'servicebus-namespace-${resourceToken}'
  scope: resourceGroup(serviceBusResourceGroup)
  params: {
    name: namespaceName
    location: location
    tags: allTags
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus-${resourceToken}'
  scope: resourceGroup(serviceBusResourceGroup)
  params: {
    namespaceName: namespaceName
    endpoints: endpoints
    resolverName: resolverName
    createResolverTopic: createResolverTopic
    createEndpointTopics: createEndpointTopics
    duplicateDetection: endpointTopicsDetectDuplicates
    logAnalyticsWorkspaceId: monitoring.outputs.workspaceId
  }
  dependsOn: [
    serviceBusNamespace
  ]
}

module serviceBusRbac 'modules/servicebus-rbac.bicep' = {
  name: 'servicebus-rbac-${resourceToken}'
  scope: resourceGroup(serviceBusResourceGroup)
  params: {
    principalId: identity.outputs.principalId
    namespaceName: serviceBus.outputs.namespaceName
    resolverTopicName: serviceBus.outputs.resolverTopicName
    resolverSubscriptionName: serviceBus.outputs.resolverSubscriptionName
    endpointTopicNames: serviceBus.outputs.endpointTopicNames
    resolverTargetBasedScaling: resolverTargetBasedScaling
    developerPrincipalId: developerPrincipalId
    developerPrincipalType: developerPrincipalType
  }
}

module rbac 'modules/rbac.bicep' = {
  name: 'rbac-${resourceToken}'
  params: {
    principalId: identity.outputs.principalId
    hostStorageName: storage.outputs.hostStorageName
    dataStorageName: storage.outputs.dataStorageName
    stateStorageNames: stateAccountsModule.outputs.storageNames
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    developerPrincipalId: developerPrincipalId
    developerPrincipalType: developerPrincipalType
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp-${resourceToken}'
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
    stateTableEndpoints: stateAccountsModule.outputs.tableEndpoints
    tablePrefix: tablePrefix
    serviceBusFullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
    resolverTopicName: serviceBus.outputs.resolverTopicName
    resolverSubscriptionName: serviceBus.outputs.resolverSubscriptionName
    duplicateDetection: endpointTopicsDetectDuplicates
    applicationInsightsConnectionString: monitoring.outputs.applicationInsightsConnectionString
    stateCatchupSchedule: stateCatchupSchedule
    stateShards: stateShards
    stateShardsPrevious: stateShardsPrevious
    stateCatchupParallelism: stateCatchupParallelism
    handoffShards: handoffShards
    handoffShardsPrevious: handoffShardsPrevious
    handoffSweeperEnabled: handoffSweeperEnabled
    handoffSweeperSchedule: handoffSweeperSchedule
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    httpAlwaysReadyInstances: httpAlwaysReadyInstances
    zoneRedundant: zoneRedundant
    operatorAppClientId: operatorAppClientId
    operatorTenantId: operatorTenantId
  }
  // Start the app only once its identity holds its roles (storage, tables, bus, telemetry).
  dependsOn: [
    rbac
    serviceBusRbac
  ]
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts-${resourceToken}'
  params: {
    namePrefix: baseName
    tags: allTags
    serviceBusNamespaceId: serviceBus.outputs.namespaceId
    resolverTopicName: serviceBus.outputs.resolverTopicName
    endpointTopicNames: serviceBus.outputs.endpointTopicNames
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    alertEmail: alertEmail
    location: location
  }
}

module workbook 'modules/workbook.bicep' = {
  name: 'workbook-${resourceToken}'
  params: {
    displayName: 'Settle operations (${environmentName})'
    location: location
    tags: allTags
    logAnalyticsWorkspaceId: monitoring.outputs.workspaceId
  }
}

output functionAppName string = functionApp.outputs.name
output functionAppUrl string = 'https://${functionApp.outputs.defaultHostName}'
output tableEndpoint string = storage.outputs.tableEndpoint
output tableNames array = [for t in settleTables: '${tablePrefix}${t}']
output serviceBusNamespace string = serviceBus.outputs.namespaceName
output serviceBusResourceGroup string = serviceBusResourceGroup
output serviceBusFullyQualifiedNamespace string = serviceBus.outputs.fullyQualifiedNamespace
output identityClientId string = identity.outputs.clientId
output deploymentContainerName string = storage.outputs.deploymentContainerName

@description('The endpoints settlement may send to: Settle\'s identity holds Azure Service Bus Data Sender on these endpoint topics only, so Service Bus refuses a settlement to any other endpoint (401) until it is added to the endpoints parameter.')
output settlementEndpoints array = serviceBus.outputs.endpointTopicNames
