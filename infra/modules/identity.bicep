// The one user-assigned managed identity Settle runs as.
// It is shared by every identity-based connection (host storage, deployment container, Settle's tables,
// Service Bus, Application Insights) and by the SDK clients in code (AZURE_CLIENT_ID), so that every
// privilege the app holds is visible as a role assignment on this one principal (see rbac.bicep).

@description('Name of the user-assigned identity.')
param name string

@description('Azure region.')
param location string

@description('Tags applied to the identity.')
param tags object = {}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: name
  location: location
  tags: tags
}

@description('Resource id (for userAssignedIdentities and deployment storage authentication).')
output id string = identity.id

@description('Client id (the value of every *__clientId setting and AZURE_CLIENT_ID).')
output clientId string = identity.properties.clientId

@description('Object id of the service principal (the principalId of role assignments).')
output principalId string = identity.properties.principalId

output name string = identity.name
