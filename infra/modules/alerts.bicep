// What an operator is woken for (metric alerts, evaluated every 5 minutes):
// - a message in the resolver subscription's dead-letter queue (the Resolver topic has one subscription,
//   so the topic's DeadletteredMessages is that queue's count): a response Settle could not project;
// - a failed function execution (Application Insights records every invocation as a request);
// - Service Bus throttling the namespace (sends and receives are being refused).
// With alertEmail set, an action group mails each alert; without it the alerts still fire in the portal.

@description('Prefix of the alert names.')
param namePrefix string

@description('Tags applied to every alert.')
param tags object = {}

@description('Resource id of the Service Bus namespace.')
param serviceBusNamespaceId string

@description('Name of the Resolver topic (its only subscription is the resolver\'s).')
param resolverTopicName string

@description('Resource id of Application Insights.')
param applicationInsightsId string

@description('E-mail address that receives the alerts; empty for none.')
param alertEmail string = ''

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
