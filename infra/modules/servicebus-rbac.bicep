// The identity's Service Bus roles, each on the narrowest entity. Deployed in the namespace's resource
// group (role assignments on another group's resources need a module scoped there). Names are
// guid(scope, principal, role): a redeployment finds the same assignment. Role IDs are read by name from
// builtin-roles.json (the verified list; tests/infra/roles.py).
//
// | role                              | scope                                        | why                                    |
// | Azure Service Bus Data Receiver   | Resolver topic / Resolver subscription       | the resolver trigger                   |
// | Azure Service Bus Data Sender     | each endpoint topic                          | settlement control messages            |
// | Azure Service Bus Data Sender     | Resolver topic                               | the resolver's scheduled redelivery    |
// | Azure Service Bus Data Owner      | Resolver subscription, only with             | Manage, which the target-based scaler  |
// |                                   | resolverTargetBasedScaling (off by default)  | needs to read the backlog (ADR-0014)   |

@description('Object id of the app\'s user-assigned identity.')
param principalId string

@description('Name of the Service Bus namespace (in this module\'s resource group).')
param namespaceName string

@description('Resolver topic name.')
@minLength(1)
@maxLength(50)
param resolverTopicName string

@description('Resolver subscription name.')
@minLength(1)
@maxLength(50)
param resolverSubscriptionName string

@description('Endpoint topics that settlement sends control messages to.')
param endpointTopicNames array

@description('Grant Azure Service Bus Data Owner on the Resolver subscription (only there) so the scale controller can read its backlog and scale the resolver by target (ADR-0014); off: Data Receiver only, incremental scaling.')
param resolverTargetBasedScaling bool = false

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

resource serviceBus 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: namespaceName
}

resource resolverTopic 'Microsoft.ServiceBus/namespaces/topics@2026-01-01' existing = {
  parent: serviceBus
  name: resolverTopicName
}

resource resolverSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2026-01-01' existing = {
  parent: resolverTopic
  name: resolverSubscriptionName
}

resource endpointTopics 'Microsoft.ServiceBus/namespaces/topics@2026-01-01' existing = [
  for topicName in endpointTopicNames: {
    parent: serviceBus
    name: topicName
  }
]

// Receive on the one subscription the resolver reads. Without Manage the target-based scaler cannot read
// the subscription's runtime properties and the resolver scales incrementally (ADR-0014).
resource resolverReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: resolverSubscription
  name: guid(resolverSubscription.id, principalId, roles['Azure Service Bus Data Receiver'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Receiver'])
  }
}

// Opt-in (ADR-0014): Manage on the one subscription the resolver reads; no built-in data role grants
// Manage without Send and Receive, so this is Data Owner, scoped to that subscription alone.
resource resolverScaleReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (resolverTargetBasedScaling) {
  scope: resolverSubscription
  name: guid(resolverSubscription.id, principalId, roles['Azure Service Bus Data Owner'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Owner'])
  }
}

resource endpointSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for (topicName, i) in endpointTopicNames: {
    scope: endpointTopics[i]
    name: guid(endpointTopics[i].id, principalId, roles['Azure Service Bus Data Sender'])
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Sender'])
    }
  }
]

// The resolver re-sends a scheduled copy of a message it could not store yet to its own topic (NimBus
// ScheduleRedelivery, contract §2.1; handoff/transport.py), so it also sends to the Resolver topic.
resource resolverSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: resolverTopic
  name: guid(resolverTopic.id, principalId, roles['Azure Service Bus Data Sender'])
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Sender'])
  }
}

// Optional developer access to the bus (for `func start` / tests against real resources).
resource developerReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: serviceBus
  name: guid(serviceBus.id, developerPrincipalId, roles['Azure Service Bus Data Receiver'])
  properties: {
    principalId: developerPrincipalId
    principalType: developerPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Receiver'])
  }
}

resource developerSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(developerPrincipalId)) {
  scope: serviceBus
  name: guid(serviceBus.id, developerPrincipalId, roles['Azure Service Bus Data Sender'])
  properties: {
    principalId: developerPrincipalId
    principalType: developerPrincipalType
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles['Azure Service Bus Data Sender'])
  }
}
