// A new Service Bus namespace with local (SAS) auth disabled: every client authenticates with Entra ID.
// Not deployed when Settle attaches to an existing namespace (main.bicep serviceBusNamespaceName).

@description('Name of the Service Bus namespace.')
param name string

@description('Azure region.')
param location string

@description('Tags applied to the namespace.')
param tags object = {}

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    // Topics and subscriptions need Standard or Premium.
    name: 'Standard'
    tier: 'Standard'
  }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

output name string = namespace.name
