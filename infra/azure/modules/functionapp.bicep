// Flex Consumption plan and the Python 3.11 Function App, with identity-based connections only.
param name string
param location string
param tags object = {}
param identityId string
param identityClientId string
@description('The Functions host storage account (AzureWebJobsStorage); holds the deployment container too.')
param hostStorageName string
@description('The delays storage account (table, leases, queues) the dispatcher works on.')
param storageName string
@description('Blob endpoint of the host storage account, for the deployment container.')
param blobEndpoint string
param deploymentContainer string
param appInsightsConnectionString string
param maximumInstanceCount int
param instanceMemoryMB int
@description('Delayed-delivery app settings (names and tuning; no secrets).')
param appSettings object

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: '${name}-plan'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: {
    name: 'FC1'
    tier: 'FlexConsumption'
  }
  properties: {
    reserved: true
  }
}

var baseSettings = {
  AzureWebJobsStorage__accountName: hostStorageName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  AZURE_CLIENT_ID: identityClientId
  DELAYED_DELIVERY_STORAGE_ACCOUNT: storageName
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  PYTHON_ENABLE_OPENTELEMETRY: 'true'
}

resource app 'Microsoft.Web/sites@2024-04-01' = {
  name: name
  location: location
  tags: union(tags, { 'azd-service-name': 'dispatcher' })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}${deploymentContainer}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: '3.11'
      }
    }
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
    }
  }

  resource settings 'config' = {
    name: 'appsettings'
    properties: union(baseSettings, appSettings)
  }
}

output name string = app.name
output id string = app.id
