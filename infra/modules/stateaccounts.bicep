// State accounts 1..N-1 (ADR-0015): more storage accounts for Settle's `state` table, so one deployment's
// state shards are spread over N accounts (shard mod N; account 0 is the data account of storage.bicep,
// which keeps every other table). Each is hardened like the data account (Entra only: shared key off),
// holds only the `state` table, sends its metrics and table request logs to Log Analytics, is locked
// against deletion like the data account; rbac.bicep grants the app's identity Storage Table Data
// Contributor on each (account scope: the code creates the table on first use). The app reaches account i through
// SETTLE_TABLES_{i}__tableServiceUri (tableEndpoints[i - 1]) with the same identity (SETTLE_TABLES__clientId).
// The shard -> account map is in each state PartitionKey: changing the number of accounts later is a layout
// change (ADR-0015: keep the earlier layout in stateShardsPrevious, never remove an account that holds rows).

@description('Names of state accounts 1..N-1, in account order (3-24 lowercase letters and digits each); empty for one account.')
param stateStorageNames array

@description('Redundancy of each state account (the same as the data account).')
@allowed([
  'Standard_ZRS'
  'Standard_LRS'
])
param dataStorageSku string = 'Standard_ZRS'

@description('Put a CanNotDelete lock on each state account (the same as on the data account).')
param lockAccounts bool

@description('Azure region.')
param location string

@description('Tags applied to each account.')
param tags object = {}

@description('Full name of the state table ({SETTLE_TABLE_PREFIX}state).')
param stateTableName string

@description('Resource id of the Log Analytics workspace that receives logs and metrics.')
param logAnalyticsWorkspaceId string

resource stateStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = [
  for name in stateStorageNames: {
    name: name
    location: location
    tags: tags
    kind: 'StorageV2'
    sku: {
      name: dataStorageSku
    }
    properties: {
      accessTier: 'Hot'
      allowSharedKeyAccess: false
      allowBlobPublicAccess: false
      allowCrossTenantReplication: false
      defaultToOAuthAuthentication: true
      minimumTlsVersion: 'TLS1_2'
      supportsHttpsTrafficOnly: true
      publicNetworkAccess: 'Enabled'
      networkAcls: {
        bypass: 'AzureServices'
        defaultAction: 'Allow'
      }
    }
  }
]

resource stateTableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = [
  for (name, i) in stateStorageNames: {
    parent: stateStorage[i]
    name: 'default'
  }
]

resource stateTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [
  for (name, i) in stateStorageNames: {
    parent: stateTableService[i]
    name: stateTableName
  }
]

resource stateStorageLock 'Microsoft.Authorization/locks@2020-05-01' = [
  for (name, i) in stateStorageNames: if (lockAccounts) {
    scope: stateStorage[i]
    name: 'settle-state-cannot-delete'
    properties: {
      level: 'CanNotDelete'
      notes: 'Settle state and history (one of several state accounts). Remove this lock before deleting the account or its resource group.'
    }
  }
]

resource stateStorageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = [
  for (name, i) in stateStorageNames: {
    scope: stateStorage[i]
    name: 'to-log-analytics'
    properties: {
      workspaceId: logAnalyticsWorkspaceId
      metrics: [
        {
          category: 'Transaction'
          enabled: true
        }
      ]
    }
  }
]

resource stateTableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = [
  for (name, i) in stateStorageNames: {
    scope: stateTableService[i]
    name: 'to-log-analytics'
    properties: {
      workspaceId: logAnalyticsWorkspaceId
      logs: [
        {
          categoryGroup: 'allLogs'
          enabled: true
        }
      ]
      metrics: [
        {
          category: 'Transaction'
          enabled: true
        }
      ]
    }
  }
]

// Table endpoint of account i at index i - 1 (SETTLE_TABLES_{i}__tableServiceUri).
output tableEndpoints array = [for (name, i) in stateStorageNames: stateStorage[i].properties.primaryEndpoints.table]

// Names of accounts 1..N-1 (rbac.bicep grants the app's identity its role on each).
output storageNames array = [for (name, i) in stateStorageNames: stateStorage[i].name]
