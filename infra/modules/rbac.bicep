// The identity's storage and telemetry roles, each scoped as narrowly as the resource model allows (its
// Service Bus roles are in servicebus-rbac.bicep, deployed where the namespace is). Names are
// guid(scope, principal, role) so a redeployment finds the same assignment (idempotent) and two different
// scopes never collide. principalType is given so ARM does not wait for Entra replication of a freshly
// created identity. Role IDs are read by name from builtin-roles.json (the verified list).
//
// | role                              | scope                                        | why                                    |
// | Storage Blob Data Owner           | host storage account                         | host blobs (leases, keys, timers) and  |
// |                                   |                                              | the Flex deployment container          |
// | Storage Table Data Contributor    | data storage account                         | Settle's tables; the code creates      |
// |                                   |                                              | tables on first use (account scope)    |
// | Storage Table Data Contributor    | each state account 1..N-1 (stateaccounts)    | the state table spread over N accounts |
// | Monitoring Metrics Publisher      | Application Insights component               | Entra-authenticated telemetry          |

@description('Object id of the app\'s user-assigned identity.')
param principalId string

@description('Name of the host storage account.')
@minLength(3)
@maxLength(24)
param hostStorageName string

@description('Name of the data storage account.')
@minLength(3)
@maxLength(24)
param dataStorageName string

@description('Names of state accounts 1..N-1 (stateaccounts.bicep); empty with one account.')
param stateStorageNames array = []

@description('Name of the Application Insights component.')
param applicationInsightsName string

@description('Optional object id of a developer or pipeline that runs Settle against these resources; empty for none.')
param developerPrincipalId string = ''

@description('Principal type of developerPrincipalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param developerPrincipalType string = 'User'

var roles = loadJsonContent('../builtin-roles.json')

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: hostStorageName
}

resource dataStorage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: dataStorageName
}

resource stateStorage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = [
  for name in stateStorageNames: {
    name: name
  }
]

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource hostBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: hostStorage
  name: guid(hostStorage.id, principalId, roles['Storage Blob Data Owner'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Blob Data Owner'])
  }
}

resource dataTableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: dataStorage
  name: guid(dataStorage.id, principalId, roles['Storage Table Data Contributor'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Table Data Contributor'])
  }
}

resource stateTableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in stateStorageNames: {
    scope: stateStorage[i]
    name: guid(stateStorage[i].id, principalId, roles['Storage Table Data Contributor'])
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Table Data Contributor'])
    }
  }
]

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, principalId, roles['Monitoring Metrics Publisher'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Monitoring Metrics Publisher'])
  }
}

// Optional developer access to the tables (for `func start` / tests against real resources).
resource developerTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: dataStorage
  name: guid(dataStorage.id, developerPrincipalId, roles['Storage Table Data Contributor'])
  properties: {
    principalId: developerPrincipalId
    principalType: developerPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Table Data Contributor'])
  }
}

resource developerStateTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (name, i) in stateStorageNames: if (!empty(developerPrincipalId)) {
    scope: stateStorage[i]
    name: guid(stateStorage[i].id, developerPrincipalId, roles['Storage Table Data Contributor'])
    properties: {
      principalId: developerPrincipalId
      principalType: developerPrincipalType
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Storage Table Data Contributor'])
    }
  }
]
