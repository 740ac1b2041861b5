// Every privilege the app's identity holds, each scoped as narrowly as the resource model allows.
// Names are guid(scope, principal, role) so a redeployment finds the same assignment (idempotent) and two
// different scopes never collide. principalType is given so ARM does not wait for Entra replication of a
// freshly created identity.
//
// | role                              | scope                                        | why                                    |
// | Storage Blob Data Owner           | host storage account                         | host blobs (leases, keys, timers) and  |
// |                                   |                                              | the Flex deployment container          |
// | Storage Table Data Contributor    | data storage account                         | Settle's tables; the code creates      |
// |                                   |                                              | tables on first use (account scope)    |
// | Azure Service Bus Data Receiver   | Resolver topic / Resolver subscription       | the resolver trigger                   |
// | Azure Service Bus Data Sender     | each endpoint topic                          | settlement control messages            |
// | Azure Service Bus Data Sender     | Resolver topic                               | the resolver's scheduled redelivery    |
// | Monitoring Metrics Publisher      | Application Insights component               | Entra-authenticated telemetry          |

@description('Object id of the app\'s user-assigned identity.')
param principalId string

@description('Name of the host storage account.')
param hostStorageName string

@description('Name of the data storage account.')
param dataStorageName string

@description('Name of the Service Bus namespace.')
param serviceBusNamespaceName string

@description('Resolver topic name.')
param resolverTopicName string

@description('Resolver subscription name.')
param resolverSubscriptionName string

@description('Endpoint topics that settlement sends control messages to.')
param endpointTopicNames array

@description('Name of the Application Insights component.')
param applicationInsightsName string

@description('Optional object id of a developer (user) who runs Settle locally against these resources; empty for none.')
param developerPrincipalId string = ''

var roles = {
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2552ae39'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}

resource hostStorage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: hostStorageName
}

resource dataStorage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: dataStorageName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: serviceBusNamespaceName
}

resource resolverTopic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' existing = {
  parent: serviceBus
  name: resolverTopicName
}

resource resolverSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' existing = {
  parent: resolverTopic
  name: resolverSubscriptionName
}

resource endpointTopics 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' existing = [
  for topicName in endpointTopicNames: {
    parent: serviceBus
    name: topicName
  }
]

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource hostBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: hostStorage
  name: guid(hostStorage.id, principalId, roles.storageBlobDataOwner)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageBlobDataOwner)
  }
}

resource dataTableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: dataStorage
  name: guid(dataStorage.id, principalId, roles.storageTableDataContributor)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
  }
}

// Receive on the one subscription the resolver reads. Without Manage, the scale controller falls back to
// the oldest message's enqueue time instead of the exact message count; Data Owner would grant far more.
resource resolverReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: resolverSubscription
  name: guid(resolverSubscription.id, principalId, roles.serviceBusDataReceiver)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
  }
}

resource endpointSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (topicName, i) in endpointTopicNames: {
    scope: endpointTopics[i]
    name: guid(endpointTopics[i].id, principalId, roles.serviceBusDataSender)
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
    }
  }
]

// The resolver re-sends a scheduled copy of a message it could not store yet to its own topic (NimBus
// ScheduleRedelivery, contract §2.1; handoff/transport.py), so it also sends to the Resolver topic.
resource resolverSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: resolverTopic
  name: guid(resolverTopic.id, principalId, roles.serviceBusDataSender)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
  }
}

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, principalId, roles.monitoringMetricsPublisher)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.monitoringMetricsPublisher)
  }
}

// Optional developer access (tables and the bus, for `func start` / tests against real resources).
resource developerTables 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: dataStorage
  name: guid(dataStorage.id, developerPrincipalId, roles.storageTableDataContributor)
  properties: {
    principalId: developerPrincipalId
    principalType: 'User'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.storageTableDataContributor)
  }
}

resource developerReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: serviceBus
  name: guid(serviceBus.id, developerPrincipalId, roles.serviceBusDataReceiver)
  properties: {
    principalId: developerPrincipalId
    principalType: 'User'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataReceiver)
  }
}

resource developerSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: serviceBus
  name: guid(serviceBus.id, developerPrincipalId, roles.serviceBusDataSender)
  properties: {
    principalId: developerPrincipalId
    principalType: 'User'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.serviceBusDataSender)
  }
}
