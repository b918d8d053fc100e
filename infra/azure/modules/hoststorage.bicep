// The Functions host's own storage account (AzureWebJobsStorage: timer schedule and locks, host keys) and the
// Flex Consumption deployment container. Kept apart from the delays data so that the host's account-wide
// Storage Blob Data Owner role reaches none of the delays, leases or queues.
param name string
param location string
param tags object = {}
param deploymentContainer string
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

resource packageContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainer
}

output name string = account.name
output id string = account.id
output blobEndpoint string = account.properties.primaryEndpoints.blob
