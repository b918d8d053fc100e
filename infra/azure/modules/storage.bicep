// The delays storage account (shared-key access disabled): the delays table, the lease container, the error and
// destination queues. The Functions host and its deployment package live in their own account (hoststorage.bicep).
param name string
param location string
param tags object = {}
param delaysName string
@description('The schedules table (recurring schedules); empty: none.')
param schedulesName string = ''
param errorQueueName string
param destinationQueues array
@allowed(['Enabled', 'Disabled'])
param publicNetworkAccess string

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    defaultToOAuthAuthentication: true
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    publicNetworkAccess: publicNetworkAccess
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource leaseContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: delaysName
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource delaysTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tableService
  name: delaysName
}

resource schedulesTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = if (!empty(schedulesName)) {
  parent: tableService
  name: schedulesName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource errorQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: errorQueueName
}

resource destinations 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [
  for queue in destinationQueues: {
    parent: queueService
    name: queue
  }
]

output name string = account.name
output id string = account.id
output queueEndpoint string = account.properties.primaryEndpoints.queue
