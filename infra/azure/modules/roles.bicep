// Least data-plane roles for the Function App's identity, each on the narrowest scope that works:
//   Storage Blob Data Owner           the host storage account (timer schedule and locks, host keys, the deployment
//                                     package); that account holds nothing else (hoststorage.bicep)
//   Storage Table Data Contributor    the delays table only: read, claim, move and delete rows; and the schedules
//                                     table when recurring schedules are on
//   Storage Blob Data Contributor     the lease container only: the shards' lease blobs
//   Storage Queue Data Message Sender each destination queue and the error queue (put only: no read, no delete);
//                                     or the whole delays account with queueSenderScope 'account'
//   Monitoring Metrics Publisher      Application Insights: Entra ID ingestion of logs and metrics
// The dispatcher never creates a table, container or queue here: it treats a 403 on create as "provisioned".
param principalId string
param hostStorageName string
param storageName string
param delaysName string
@description('The schedules table (recurring schedules); empty: none.')
param schedulesName string = ''
@description('Queues the identity may put messages on: the destination queues and the error queue.')
param senderQueues array
@allowed(['queues', 'account'])
param queueSenderScope string
param appInsightsName string

var blobDataOwner = 'b7e6dc6d-f1e8-4753-8033-0f2253ddb2a6'
var blobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var tableDataContributor = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
var queueMessageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'
var metricsPublisher = '3913510d-42f4-4e42-8a64-420c390055eb'

resource hostAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: hostStorageName
}

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

resource schedulesTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = if (!empty(schedulesName)) {
  parent: tableService
  name: schedulesName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource leaseContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: delaysName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource queues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [
  for queue in senderQueues: {
    parent: queueService
    name: queue
  }
]

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource hostBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: hostAccount
  name: guid(hostAccount.id, principalId, blobDataOwner)
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

resource schedulesTableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(schedulesName)) {
  scope: schedulesTable
  name: guid(schedulesTable.id, principalId, tableDataContributor)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', tableDataContributor)
  }
}

resource leaseContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: leaseContainer
  name: guid(leaseContainer.id, principalId, blobDataContributor)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', blobDataContributor)
  }
}

resource queueSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [
  for i in range(0, length(senderQueues)): if (queueSenderScope == 'queues') {
    scope: queues[i]
    name: guid(queues[i].id, principalId, queueMessageSender)
    properties: {
      principalId: principalId
      principalType: 'ServicePrincipal'
      roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueMessageSender)
    }
  }
]

resource accountQueueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (queueSenderScope == 'account') {
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
