// Settle's operations Workbook (infra/workbooks/settle-operations.json): hand-offs in flight and overdue per
// endpoint, settlements unconfirmed, poison per day, state locks taken and expired, catch-up runs and their
// duration, resolver latency. Saved on the Log Analytics workspace (its Workbooks gallery) and querying it:
// Settle's metrics are in AppMetrics, its spans in AppDependencies (workspace-based Application Insights).
// tests/infra/test_workbook.py checks that every metric and span it reads is one Settle records.

@description('Display name of the Workbook in the portal.')
param displayName string

@description('Azure region (that of the workspace).')
param location string

@description('Tags applied to the Workbook.')
param tags object = {}

@description('Resource id of the Log Analytics workspace: the Workbook is saved on it and queries it.')
param logAnalyticsWorkspaceId string

// A shared Workbook's name must be a GUID; this one is stable per workspace, so a redeployment updates it.
resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(logAnalyticsWorkspaceId, 'settle-operations')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: displayName
    category: 'workbook'
    version: 'Notebook/1.0'
    sourceId: logAnalyticsWorkspaceId
    // The JSON names no workspace; it is opened on this one (fallbackResourceIds) wherever it is opened from.
    serializedData: replace(loadTextContent('../workbooks/settle-operations.json'), '__SETTLE_WORKSPACE_ID__', logAnalyticsWorkspaceId)
  }
}

output workbookId string = workbook.id
