// Two storage accounts, both Entra-only (shared key off, so no connection string can work):
// - host: the Functions host's own blobs (leases, timer schedule monitor) and the Flex deployment
//   container that holds the app package;
// - data: Settle's tables and nothing else.
// Keeping them apart lets the identity hold Table Data Contributor on the data account only and Blob
// Data Owner on the host account only (docs/adr/0010-infra-flex-identity-two-storage-accounts.md).

@description('Name of the host storage account (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param hostStorageName string

@description('Name of the data storage account that holds Settle\'s tables (3-24 lowercase letters and digits).')
@minLength(3)
@maxLength(24)
param dataStorageName string

@description('Azure region.')
param location string

@description('Tags applied to both accounts.')
param tags object = {}

@description('Blob container that holds the Flex Consumption deployment package (one per app).')
param deploymentContainerName string

@description('Full names of the tables Settle uses ({SETTLE_TABLE_PREFIX}<name>).')
param tableNames array

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: hostStorageName
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    // Locally redundant is enough: host blobs are rebuilt by the host and the package by a redeploy.
    name: 'Standard_LRS'
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
    // Zone-redundant: the tables are the only copy of Settle's state and history.
    name: 'Standard_ZRS'
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

output hostStorageName string = hostStorage.name
output hostBlobEndpoint string = hostStorage.properties.primaryEndpoints.blob
output dataStorageName string = dataStorage.name
output tableEndpoint string = dataStorage.properties.primaryEndpoints.table
output deploymentContainerName string = deploymentContainer.name
