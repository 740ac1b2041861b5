// What an operator is woken for. Metric alerts, evaluated every 5 minutes:
// - a message in the resolver subscription's dead-letter queue (the Resolver topic has one subscription,
//   so the topic's DeadletteredMessages is that queue's count): a response Settle could not project;
// - a message dead-lettered on an endpoint topic (its fan-out subscription or the endpoint's own);
// - a failed function execution (Application Insights records every invocation as a request);
// - Service Bus throttling the namespace (sends and receives are being refused).
// Log search alerts on Settle's own metrics (OpenTelemetry, exported to Application Insights'
// customMetrics table by common/telemetry.py; docs/observability.md explains each signal):
// - a poison resolver message (stored in hopoison instead of projected);
// - catch-up failing more expired locks than a threshold (workers dying while they hold locks);
// - a parked hand-off past its ExpectedBy while the timeout sweeper is off (nobody will fail it);
// - the share of settlements answered 503 (Service Bus or storage unavailable) above a threshold.
// With alertEmail set, an action group mails each alert; without it the alerts still fire in the portal.

@description('Prefix of the alert names.')
param namePrefix string

@description('Tags applied to every alert.')
param tags object = {}

@description('Resource id of the Service Bus namespace.')
param serviceBusNamespaceId string

@description('Name of the Resolver topic (its only subscription is the resolver\'s).')
param resolverTopicName string

@description('NimBus endpoint topics (each with the endpoint\'s subscription and the fan-out to the resolver).')
param endpointTopicNames array = []

@description('Resource id of Application Insights.')
param applicationInsightsId string

@description('E-mail address that receives the alerts; empty for none.')
param alertEmail string = ''

@description('Azure region of the log search alerts (that of Application Insights).')
param location string

@description('Expired locks catch-up turns Failed within 15 minutes above which the alert fires.')
@minValue(0)
param expiredLocksThreshold int = 10

@description('Percent of settlements answered 503 within 15 minutes above which the alert fires.')
@minValue(0)
@maxValue(100)
param settlementUnavailablePercent int = 5

resource operators 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: 'ag-${namePrefix}'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'settle'
    enabled: true
    emailReceivers: [
      {
        name: 'operators'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

var mailOperators = [
  {
    actionGroupId: operators.id
  }
]

resource resolverDeadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'alert-${namePrefix}-resolver-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'The resolver subscription holds dead-lettered messages: responses Settle could not project.'
    severity: 1
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'ResolverDeadLetters'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                resolverTopicName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: empty(alertEmail) ? [] : mailOperators
  }
}

// Dead letters on an endpoint topic: its fan-out subscription (a message that never reached the resolver)
// or the endpoint's own subscription (a request its NimBus handler could not process). DeadletteredMessages
// per EntityName is the topic's count over its subscriptions.
resource endpointDeadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = if (!empty(endpointTopicNames)) {
  name: 'alert-${namePrefix}-endpoint-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'A subscription of an endpoint topic holds dead-lettered messages: the fan-out to the resolver or the endpoint\'s own handler gave up on a message.'
    severity: 1
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'EndpointDeadLetters'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: endpointTopicNames
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: empty(alertEmail) ? [] : mailOperators
  }
}

resource functionFailures 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'alert-${namePrefix}-function-failures'
  location: 'global'
  tags: tags
  properties: {
    description: 'A function execution failed (HTTP 5xx, resolver or timer exception).'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'FailedExecutions'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'microsoft.insights/components'
          metricName: 'requests/failed'
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Count'
        }
      ]
    }
    actions: empty(alertEmail) ? [] : mailOperators
  }
}

resource serviceBusThrottling 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'alert-${namePrefix}-servicebus-throttling'
  location: 'global'
  tags: tags
  properties: {
    description: 'Service Bus throttled requests of the namespace.'
    severity: 2
    enabled: true
    scopes: [
      serviceBusNamespaceId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'ThrottledRequests'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ThrottledRequests'
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Total'
        }
      ]
    }
    actions: empty(alertEmail) ? [] : mailOperators
  }
}

// Settle's metrics in customMetrics: one row per metric, attribute set and export interval (a counter's
// value is the increase in that interval, a gauge's the last value); attributes are in customDimensions.
var settleLogAlerts = [
  {
    name: 'poison-messages'
    severity: 1
    windowSize: 'PT5M'
    description: 'The resolver stored a poison message (unknown type, no From, unreadable body, or its retry budget exhausted) in the hopoison table instead of projecting it.'
    query: 'customMetrics | where name == "settle.resolver.messages" and tostring(customDimensions["outcome"]) == "poison" | summarize Poison = sum(value)'
    column: 'Poison'
    threshold: 0
  }
  {
    name: 'expired-locks'
    severity: 2
    windowSize: 'PT15M'
    description: 'Catch-up turned more expired locks Failed than expected: workers take locks and die (or run past their lock) without recording an outcome.'
    query: 'customMetrics | where name == "settle.catchup.expired_locks" | summarize ExpiredLocks = sum(value)'
    column: 'ExpiredLocks'
    threshold: expiredLocksThreshold
  }
  {
    name: 'overdue-handoffs'
    severity: 2
    windowSize: 'PT15M'
    description: 'A parked hand-off is past its ExpectedBy and the timeout sweeper is off (HANDOFF_SWEEPER_ENABLED=false): nothing will fail it; its status checker may be down.'
    query: 'customMetrics | where name == "settle.handoff.overdue" and tostring(customDimensions["sweeper"]) == "off" | summarize Overdue = max(value)'
    column: 'Overdue'
    threshold: 0
  }
  {
    name: 'settlement-unavailable'
    severity: 2
    windowSize: 'PT15M'
    description: 'Too many settlements were answered 503: Service Bus or storage was unavailable and nothing was sent (callers retry).'
    query: 'customMetrics | where name == "settle.handoff.settlements" | summarize Total = sum(value), Unavailable = sumif(value, tostring(customDimensions["outcome"]) == "unavailable") | extend UnavailablePercent = iff(Total == 0, 0.0, 100.0 * Unavailable / Total)'
    column: 'UnavailablePercent'
    threshold: settlementUnavailablePercent
  }
]

resource settleSignals 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [
  for alert in settleLogAlerts: {
    name: 'alert-${namePrefix}-${alert.name}'
    location: location
    tags: tags
    kind: 'LogAlert'
    properties: {
      displayName: 'Settle: ${alert.name}'
      description: alert.description
      severity: alert.severity
      enabled: true
      scopes: [
        applicationInsightsId
      ]
      evaluationFrequency: 'PT5M'
      windowSize: alert.windowSize
      autoMitigate: true
      criteria: {
        allOf: [
          {
            query: alert.query
            timeAggregation: 'Total'
            metricMeasureColumn: alert.column
            operator: 'GreaterThan'
            threshold: alert.threshold
            failingPeriods: {
              numberOfEvaluationPeriods: 1
              minFailingPeriodsToAlert: 1
            }
          }
        ]
      }
      actions: {
        actionGroups: empty(alertEmail) ? [] : [
          operators.id
        ]
      }
    }
  }
]
