// Log Analytics workspace + workspace-based Application Insights, both with local (key) auth disabled:
// telemetry is accepted only with an Entra token, which the app obtains through its managed identity
// (APPLICATIONINSIGHTS_AUTHENTICATION_STRING + Monitoring Metrics Publisher in rbac.bicep).
// With local auth disabled, the instrumentation key in the connection string is an identifier, not a secret.

@description('Name of the Log Analytics workspace.')
param logAnalyticsName string

@description('Name of the Application Insights component.')
param applicationInsightsName string

@description('Azure region.')
param location string

@description('Tags applied to both resources.')
param tags object = {}

@description('Days the workspace keeps logs.')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    features: {
      disableLocalAuth: true
    }
  }
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    DisableLocalAuth: true
  }
}

output applicationInsightsName string = appInsights.name

@description('Resource id of Application Insights (the scope of the function-failure alert).')
output applicationInsightsId string = appInsights.id

@description('Resource id of the Log Analytics workspace (the destination of every diagnostic setting).')
output workspaceId string = workspace.id

@description('Connection string of Application Insights (ingestion endpoint + instrumentation key; no secret because local auth is disabled).')
output applicationInsightsConnectionString string = appInsights.properties.ConnectionString
