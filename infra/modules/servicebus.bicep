// The NimBus-compatible topology Settle needs on a Service Bus namespace (created by
// servicebus-namespace.bicep, or an existing one), and the namespace's diagnostic settings
// (docs: shared/reference/nimbus-contract.md §1.1, NimBus TopologyDescriptor):
//
//   Resolver topic
//     └─ Resolver subscription (sessions ON, $Default true filter) ........ the resolver trigger reads here
//   {ep} topic, for each endpoint in `endpoints`
//     ├─ {ep} subscription (sessions ON) ................................... the NimBus endpoint's handler
//     │    rules: to-{ep}, continuation (+ action), retry (+ action)
//     └─ Resolver subscription (sessions OFF, forwardTo Resolver topic) .... fan-out to the resolver
//          rules: from-{ep} (responses, action stamps From), to-{ep} (requests and control messages)
//
// Responses (To='Resolver') and Manager/hand-off control messages (To='{ep}', From='Manager'), which
// Settle's settlement sends to the endpoint topic, therefore both reach the Resolver subscription.
// On a NimBus namespace these exist already: createResolverTopic / createEndpointTopics false.
//
// Left out on purpose (they never carry traffic to the resolver, and NimBus's own provisioning creates
// them for an endpoint that uses the feature): `{ep}-reply` (request/reply), `Deferred` and
// `DeferredProcessor` (session deferral), and the per-event-type producer->consumer forwarding
// subscriptions, which depend on NimBus's event catalogue.
//
// Rules: a subscription created through ARM gets a `$Default` rule with a true filter, which would let
// every message through next to the named rules. Where the contract has named rules, `$Default` is
// redeclared with a filter that never matches (1=0), the ARM equivalent of NimBus deleting it.
//
// Service Bus answers 409 Conflict to concurrent changes under one topic or subscription, so the
// subscriptions of a topic and the rules of a subscription are created one after the other (dependsOn
// chains; tests/infra/rules.py checks it).

@description('Name of the Service Bus namespace (in this module\'s resource group).')
param namespaceName string

@description('NimBus endpoint ids whose endpoint topics (and fan-out to the resolver) are created here.')
param endpoints array

@description('Name of the resolver topic and of its session-enabled subscription (NimBus ResolverId).')
@minLength(1)
@maxLength(50)
param resolverName string = 'Resolver'

@description('Create the Resolver topic and subscription (false: they exist, e.g. NimBus created them).')
param createResolverTopic bool = true

@description('Create the endpoint topics with their subscriptions and rules (false: NimBus created them).')
param createEndpointTopics bool = true

@description('Create the endpoint topics with duplicate detection (a topic cannot change it later).')
param duplicateDetection bool = true

@description('Peek-lock duration of every subscription (NimBus: 30 seconds; the host renews locks).')
param lockDuration string = 'PT30S'

@description('Deliveries before a message is dead-lettered (NimBus: 10).')
@minValue(1)
@maxValue(2000)
param maxDeliveryCount int = 10

@description('Resource id of the Log Analytics workspace that receives the namespace\'s logs and metrics.')
param logAnalyticsWorkspaceId string

resource namespace 'Microsoft.ServiceBus/namespaces@2026-01-01' existing = {
  name: namespaceName
}

// No duplicate detection on the Resolver topic: a rescheduled copy keeps its MessageId (contract §2.1).
resource resolverTopic 'Microsoft.ServiceBus/namespaces/topics@2026-01-01' = if (createResolverTopic) {
  parent: namespace
  name: resolverName
  properties: {
    enableBatchedOperations: true
    requiresDuplicateDetection: false
  }
}

// Keeps its $Default true filter: everything forwarded to the Resolver topic is projected.
resource resolverSubscription 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2026-01-01' = if (createResolverTopic) {
  parent: resolverTopic
  name: resolverName
  properties: {
    requiresSession: true
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    deadLetteringOnMessageExpiration: true
    enableBatchedOperations: true
  }
}

resource endpointTopics 'Microsoft.ServiceBus/namespaces/topics@2026-01-01' = [
  for ep in endpoints: if (createEndpointTopics) {
    parent: namespace
    name: ep
    properties: {
      enableBatchedOperations: true
      // Settle's control messages carry a MessageId derived from the hand-off (handoff/contract.py), so a
      // settlement retried after an ambiguous send is dropped here instead of reaching the endpoint twice.
      requiresDuplicateDetection: duplicateDetection
      duplicateDetectionHistoryTimeWindow: 'PT10M'
    }
  }
]

// The endpoint's own subscription (read by the NimBus subscriber, not by Settle).
resource endpointSubscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointTopics[i]
    name: ep
    properties: {
      requiresSession: true
      lockDuration: lockDuration
      maxDeliveryCount: maxDeliveryCount
      deadLetteringOnMessageExpiration: true
      enableBatchedOperations: true
    }
  }
]

resource endpointDefaultRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointSubscriptions[i]
    name: '$Default'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: '1=0'
      }
    }
  }
]

resource endpointToRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointSubscriptions[i]
    name: 'to-${ep}'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: 'user.To = \'${ep}\''
      }
    }
    dependsOn: [
      endpointDefaultRules[i]
    ]
  }
]

resource endpointContinuationRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointSubscriptions[i]
    name: 'continuation'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: 'user.To = \'Continuation\''
      }
      action: {
        sqlExpression: 'SET user.To = \'${ep}\'; SET user.From = \'Continuation\';'
      }
    }
    dependsOn: [
      endpointToRules[i]
    ]
  }
]

resource endpointRetryRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointSubscriptions[i]
    name: 'retry'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: 'user.To = \'Retry\''
      }
      action: {
        sqlExpression: 'SET user.To = \'${ep}\'; SET user.From = \'Retry\';'
      }
    }
    dependsOn: [
      endpointContinuationRules[i]
    ]
  }
]

// The fan-out copy to the resolver. Sessions stay off here (forwarding keeps SessionId, and the Resolver
// subscription is the one that is session-enabled).
resource fanoutSubscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: endpointTopics[i]
    name: resolverName
    properties: {
      requiresSession: false
      forwardTo: resolverName
      lockDuration: lockDuration
      maxDeliveryCount: maxDeliveryCount
      deadLetteringOnMessageExpiration: true
      enableBatchedOperations: true
    }
    // After the endpoint subscription and its rules: one change at a time under the topic.
    dependsOn: [
      resolverTopic
      endpointRetryRules[i]
    ]
  }
]

resource fanoutDefaultRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: fanoutSubscriptions[i]
    name: '$Default'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: '1=0'
      }
    }
  }
]

// Responses: the subscriber sends them to its own topic with To='Resolver'; the action stamps From.
resource fanoutFromRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: fanoutSubscriptions[i]
    name: 'from-${ep}'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: 'user.To = \'${resolverName}\''
      }
      action: {
        sqlExpression: 'SET user.From = \'${ep}\''
      }
    }
    dependsOn: [
      fanoutDefaultRules[i]
    ]
  }
]

// Requests and control messages addressed to the endpoint (EventRequest, HandoffCompletedRequest, ...).
resource fanoutToRules 'Microsoft.ServiceBus/namespaces/topics/subscriptions/rules@2026-01-01' = [
  for (ep, i) in endpoints: if (createEndpointTopics) {
    parent: fanoutSubscriptions[i]
    name: 'to-${ep}'
    properties: {
      filterType: 'SqlFilter'
      sqlFilter: {
        sqlExpression: 'user.To = \'${ep}\''
      }
    }
    dependsOn: [
      fanoutFromRules[i]
    ]
  }
]

// Logs and metrics of the namespace (an attached one's too) go to Settle's Log Analytics workspace.
resource namespaceDiagnostics 'Microsoft.Insights/diagnosticSettings@2021-05-01-preview' = {
  scope: namespace
  name: 'settle-to-log-analytics'
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
        category: 'AllMetrics'
        enabled: true
      }
    ]
  }
}

output namespaceName string = namespace.name

@description('Resource id of the namespace (the scope of the Service Bus alerts).')
output namespaceId string = namespace.id

@description('Host name of the namespace (<name>.servicebus.windows.net in the public cloud).')
// serviceBusEndpoint is https://<host>:443/ ; the setting wants the bare host (an Endpoint= form breaks it).
output fullyQualifiedNamespace string = split(split(namespace.properties.serviceBusEndpoint, '/')[2], ':')[0]

output resolverTopicName string = resolverName
output resolverSubscriptionName string = resolverName
output endpointTopicNames array = endpoints
