// Two storage accounts, both Entra-only (shared key off, so no connection string can work):
// - host: the Functions host's own blobs (leases, timer schedule monitor) and the Flex deployment
//   container that holds the app package;
// - data: Settle's tables and nothing else (zone-redundant by default, optionally locked against deletion).
// Keeping them apart lets the identity hold Table Data Contributor on the data account only and Blob
// Data Owner on the host account only (docs/adr/0010-infra-flex-identity-two-storage-accounts.md).
// Both send their metrics, and the blob/table services their request logs, to Log Analytics.

@description('Name of the host storage account (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param hostStorageName string

@description('Name of the data storage account that holds Settle\'s tables (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param dataStorageName string

@description('Redundancy of the data account: zone-redundant where the region offers it.')
@allowed([
  'Standard_ZRS'
  'Standard_LRS'
])
param dataStorageSku string = 'Standard_ZRS'

@description('Zone-redundant deployment: the host account is Standard_ZRS too, so a zone outage does not stop the host (leases, timers) or the package while the plan keeps running.')
param zoneRedundant bool = false

@description('Put a CanNotDelete lock on the data account.')
param lockDataAccount bool

@description('Azure region.')
param location string

@description('Tags applied to both accounts.')
param tags object = {}

@description('Blob container that holds the Flex Consumption deployment package (one per app).')
param deploymentContainerName string

@description('Full names of the tables Settle uses ({SETTLE_TABLE_PREFIX}<name>).')
param tableNames array

@description('Resource id of the Log Analytics workspace that receives logs and metrics.')
param logAnalyticsWorkspaceId string

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: hostStorageName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    // Locally redundant is enough for a single-zone app (host blobs are rebuilt by the host, the package by
    // a redeploy); a zone-redundant app needs its host storage in every zone too.
    name: zoneRedundant ? 'Standard_ZRS' : 'Standard_LRS'
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

resource hostBlobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: hostStorage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: hostBlobs
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource dataStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: dataStorageName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    // Zone-redundant by default: the tables are the only copy of Settle's state and history.
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

resource dataTableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: dataStorage
  name: 'default'
}

// The code also creates each table on first use (create_table_if_not_exists), so a table added in code
// works before this list catches up; declaring them here makes the deployment complete and reviewable.
resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [
  for tableName in tableNames: {
    parent: dataTableService
    name: tableName
  }
]

// A deleted account takes Settle's state and history with it: a lock makes deletion a two-step decision
// (also for the resource group). It guards the account, not its data: the Table API works as before.
resource dataStorageLock 'Microsoft.Authorization/locks@2020-05-01' = if (lockDataAccount) {
  scope: dataStorage
  name: 'settle-data-cannot-delete'
  properties: {
    level: 'CanNotDelete'
    notes: 'Settle state and history. Remove this lock before deleting the account or its resource group.'
  }
}

// Account-level settings take metrics only; request logs are settings of the blob and table services.
resource hostStorageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: hostStorage
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

resource hostBlobDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: hostBlobs
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

resource dataStorageDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: dataStorage
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

resource dataTableDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: dataTableService
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

output hostStorageName string = hostStorage.name
output hostBlobEndpoint string = hostStorage.properties.primaryEndpoints.blob
output dataStorageName string = dataStorage.name
output tableEndpoint string = dataStorage.properties.primaryEndpoints.table
output deploymentContainerName string = deploymentContainer.name
