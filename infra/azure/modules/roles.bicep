// Least data-plane roles for the Function App's identity:
//   Storage Blob Data Owner          account  host storage (timer locks, deployment package) and the shard leases
//   Storage Table Data Contributor   the delays table only: read, claim, move and delete rows
//   Storage Queue Data Message Sender account  put messages on destination and error queues (no read, no delete)
//   Monitoring Metrics Publisher     Application Insights: Entra ID ingestion of logs and metrics
param principalId string
param storageName string
param delaysName string
param appInsightsName string

var blobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f2253ddb2a6'
var tableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var queueMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'
var metricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageName
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource delaysTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: delaysName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: account
  name: guid(account.id, principalId, blobDataOwner)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataOwner)
  }
}

resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: delaysTable
  name: guid(delaysTable.id, principalId, tableDataContributor)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', tableDataContributor)
  }
}

resource queueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: account
  name: guid(account.id, principalId, queueMessageSender)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueMessageSender)
  }
}

resource telemetryPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: appInsights
  name: guid(appInsights.id, principalId, metricsPublisher)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', metricsPublisher)
  }
}
