// The example consumer's access (deployExampleConsumer): its queue and the poison queue the Functions host moves a
// message to after five failed tries, both made here if missing, and the least roles a queue trigger needs on them:
//   Storage Queue Data Reader             the consumer queue: the trigger reads its length to scale
//   Storage Queue Data Message Processor  the consumer queue: receive and delete
//   Storage Queue Data Message Sender     the poison queue: put only
param principalId string
param storageName string
@description('The queue the example consumer reads.')
@minLength(3)
param queueName string

var queueReader = '19e7f393-937e-4f77-808e-94535e297925'
var messageProcessor = '8a0f0c08-91a1-4084-bc3d-661d67233fed'
var messageSender = 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource consumerQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: queueName
}

resource poisonQueue 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = {
  parent: queueService
  name: '${queueName}-poison'
}

resource reader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: consumerQueue
  name: guid(consumerQueue.id, principalId, queueReader)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', queueReader)
  }
}

resource processor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: consumerQueue
  name: guid(consumerQueue.id, principalId, messageProcessor)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', messageProcessor)
  }
}

resource poisonSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: poisonQueue
  name: guid(poisonQueue.id, principalId, messageSender)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', messageSender)
  }
}
