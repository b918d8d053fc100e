// Delayed delivery for Azure Storage Queues: storage, monitoring, identity and the dispatcher Function App.
// Deploy: az deployment group create -g <rg> -f infra/azure/main.bicep -p infra/azure/main.parameters.json
targetScope = 'resourceGroup'

@description('Azure region for every resource.')
param location string = resourceGroup().location

@description('Short prefix for resource names (letters and digits).')
@minLength(3)
@maxLength(11)
param namePrefix string = 'delaydlv'

@description('Endpoint that owns the delays table (informational; used by senders).')
param endpointName string = 'orders'

@description('Delays table and lease container name: "delays" + SHA-1 of the endpoint name (print it with `delayed-delivery azure names --endpoint <name>`), or your override.')
@minLength(3)
@maxLength(63)
param delaysName string

@description('Queue receiving messages that could not be delivered.')
param errorQueueName string = 'error'

@description('Destination queues to create; the identity may put messages on each of them (and on the error queue).')
param destinationQueues array = []

@description('Queue names or */? patterns the dispatcher may send to. Default: the destination queues this template creates. The error queue is always allowed; an empty list allows only the error queue. [\'*\'] allows any queue of the delays account (pair it with queueSenderScope \'account\').')
param allowedDestinations array = destinationQueues

@description('Where the identity gets Storage Queue Data Message Sender: on each queue this template creates (\'queues\'), or on the whole delays account (\'account\', for allowedDestinations patterns or queues made elsewhere).')
@allowed(['queues', 'account'])
param queueSenderScope string = 'queues'

@description('Public network access of both storage accounts. \'Disabled\' needs private endpoints (blob, table, queue) and private DNS, and VNet integration of the Function App, none of which this template creates: see docs/azure.md.')
@allowed(['Enabled', 'Disabled'])
param publicNetworkAccess string = 'Enabled'

@description('Partitions / leases; fixed for the lifetime of the delays table.')
@minValue(1)
@maxValue(1000)
param shards int = 1

@description('Blob lease duration in seconds (15-60).')
@minValue(15)
@maxValue(60)
param leaseSeconds int = 30

@description('How long each timer run dispatches (seconds); keep it under the one-minute schedule.')
@minValue(5)
@maxValue(58)
param runSeconds int = 50

@description('Seconds before their due time that rows are put on their queues, hidden until due by the visibility timeout, so a burst due in one second needs no puts in that second (0: off; at most 7 days less a minute). A placed message is cancelled or rescheduled on its queue by its pop receipt until it is visible (the operator needs delete, and for reschedule update, rights on the queue).')
@minValue(0)
@maxValue(604740)
param placeAheadSeconds int = 7200

@description('Switch delayed delivery off: the function does nothing and senders refuse table delays.')
param enabled bool = true

@description('Flex Consumption: most instances.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Flex Consumption: instance memory (MB).')
@allowed([512, 2048, 4096])
param instanceMemoryMB int = 2048

@description('Release control: destination queue name -> most messages per second released to it ("*" the default for queues not named, null for no cap), e.g. {"orders": 200, "*": 1000}. Empty: no cap. Each shard takes its share.')
param releaseRates object = {}

@description('Alert when release control holds a message back more than this many seconds (its release lag).')
@minValue(1)
param releaseLagAlertSeconds int = 300

@description('Alert when a timer run lasts more than this many seconds beyond its budget (runSeconds): the next run starts late.')
@minValue(1)
param runOverrunAlertSeconds int = 5

@description('Alert when placing ahead ends a timer run this many seconds inside its lead (placeAheadSeconds) with rows left to place: a backlog that, at the lead, is sent late from the due second.')
@minValue(1)
param placementLagAlertSeconds int = 3600

@description('Action group (resource id) every alert notifies. Empty: the alerts are created and show in the portal, but notify no one.')
param alertActionGroupId string = ''

@description('Alert when a message is dispatched more than this many seconds after its due time.')
@minValue(1)
param latenessAlertSeconds int = 60

@description('Alert when more than this many shard leases are lost within 15 minutes.')
@minValue(0)
param leaseLossAlertCount int = 3

@description('Alert when no timer run has finished for this many minutes.')
@allowed([5, 10, 15, 30, 45])
param timerSilenceMinutes int = 10

@description('Alert when more than this many sends to destination queues fail within 5 minutes.')
@minValue(0)
param sendFailureAlertCount int = 10

@description('Log the delays table\'s pending rows by due hour every 15 minutes (a second timer; reads the due rows\' keys, at most 200,000) for the workbook and the oldest-overdue alert.')
param pendingCensus bool = true

@description('Alert when the census finds a row overdue by more than this many seconds.')
@minValue(1)
param oldestOverdueAlertSeconds int = 300

@description('Add the example consumer: a queue-trigger function in the same app that reads exampleConsumerQueue and logs each message\'s lateness (functions/azure/consumer_app.py shows it to copy).')
param deployExampleConsumer bool = false

@description('Queue the example consumer reads (default: the first destination queue).')
param exampleConsumerQueue string = join(take(destinationQueues, 1), '')

@description('Add the probe queue `delayed-delivery azure verify` sends its probes to: created, allowed as a destination, and sendable by the identity. An empty queue costs nothing.')
param deployVerifyProbe bool = true

@description('The probe queue\'s name (`azure verify --probe-queue`).')
@minLength(3)
@maxLength(63)
param verifyProbeQueue string = 'delayed-delivery-probe'

@description('Recurring schedules (`delayed-delivery schedule create --cloud azure`): a schedules table beside the delays table and a second timer in the function app that writes each occurrence due within scheduleLeadSeconds as a row of the delays table (docs/schedules.md, "On Azure").')
param recurringSchedules bool = false

@description('How far ahead (seconds) the schedule timer writes occurrences as rows of the delays table. 900 (the most): a burst of schedules due together (100,000 at 09:00) is written and placed ahead before it is due (docs/schedules.md, "Costs and bursts").')
@minValue(0)
@maxValue(900)
param scheduleLeadSeconds int = 900

param tags object = {}

var suffix = uniqueString(subscription().id, resourceGroup().id, namePrefix)
var storageName = toLower(take('${namePrefix}${suffix}', 24))
var hostStorageName = toLower(take('${namePrefix}${uniqueString(subscription().id, resourceGroup().id, namePrefix, 'host')}', 24))
var deploymentContainer = 'app-package-${take(suffix, 8)}'
// The verify probe's queue, when deployed: one more destination, created and allowed like the others.
var probeQueues = deployVerifyProbe ? [verifyProbeQueue] : []
var createdQueues = union(destinationQueues, probeQueues)
// The schedules table (recurringSchedules): the delays table's name plus 'sched', as the code derives it.
var schedulesName = recurringSchedules ? '${take(delaysName, 58)}sched' : ''
// Never empty: an empty DELAYED_DELIVERY_ALLOWED_DESTINATIONS would mean any queue of the account.
var destinationAllowList = union(empty(allowedDestinations) ? [errorQueueName] : allowedDestinations, probeQueues)
// The example consumer's queue trigger: the queue, and an identity-based connection to the delays account.
var exampleConsumerSettings = deployExampleConsumer
  ? {
      DELAYED_DELIVERY_EXAMPLE_CONSUMER_QUEUE: exampleConsumerQueue
      DelayedDeliveryQueues__queueServiceUri: storage.outputs.queueEndpoint
      DelayedDeliveryQueues__credential: 'managedidentity'
      DelayedDeliveryQueues__clientId: identity.outputs.clientId
    }
  : {}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: {
    name: '${namePrefix}-id-${suffix}'
    location: location
    tags: tags
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    name: storageName
    location: location
    tags: tags
    delaysName: delaysName
    schedulesName: schedulesName
    errorQueueName: errorQueueName
    destinationQueues: createdQueues
    publicNetworkAccess: publicNetworkAccess
  }
}

module hostStorage 'modules/hoststorage.bicep' = {
  name: 'hoststorage'
  params: {
    name: hostStorageName
    location: location
    tags: tags
    deploymentContainer: deploymentContainer
    publicNetworkAccess: publicNetworkAccess
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    namePrefix: '${namePrefix}-${suffix}'
    location: location
    tags: tags
  }
}

module operations 'modules/operations.bicep' = {
  name: 'operations'
  params: {
    namePrefix: '${namePrefix}-${suffix}'
    location: location
    tags: tags
    appInsightsName: monitoring.outputs.appInsightsName
    actionGroupId: alertActionGroupId
    latenessThresholdSeconds: latenessAlertSeconds
    leaseLossThreshold: leaseLossAlertCount
    timerSilenceMinutes: timerSilenceMinutes
    sendFailureThreshold: sendFailureAlertCount
    oldestOverdueSeconds: oldestOverdueAlertSeconds
    releaseLagSeconds: releaseLagAlertSeconds
    runOverrunSeconds: runOverrunAlertSeconds
    placementLagSeconds: placementLagAlertSeconds
  }
}

module consumer 'modules/consumer.bicep' = if (deployExampleConsumer) {
  name: 'consumer'
  params: {
    principalId: identity.outputs.principalId
    storageName: storage.outputs.name
    queueName: exampleConsumerQueue
  }
}

module roles 'modules/roles.bicep' = {
  name: 'roles'
  params: {
    principalId: identity.outputs.principalId
    hostStorageName: hostStorage.outputs.name
    storageName: storage.outputs.name
    delaysName: delaysName
    schedulesName: schedulesName
    senderQueues: union(createdQueues, [errorQueueName])
    queueSenderScope: queueSenderScope
    appInsightsName: monitoring.outputs.appInsightsName
  }
}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  dependsOn: [roles, consumer]
  params: {
    name: '${namePrefix}-func-${suffix}'
    location: location
    tags: tags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    hostStorageName: hostStorage.outputs.name
    storageName: storage.outputs.name
    blobEndpoint: hostStorage.outputs.blobEndpoint
    deploymentContainer: deploymentContainer
    appInsightsConnectionString: monitoring.outputs.connectionString
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
    appSettings: union(exampleConsumerSettings, {
      DELAYED_DELIVERY_ENDPOINT: endpointName
      DELAYED_DELIVERY_TABLE_NAME: delaysName
      DELAYED_DELIVERY_CONTAINER_NAME: delaysName
      DELAYED_DELIVERY_ERROR_QUEUE: errorQueueName
      DELAYED_DELIVERY_ALLOWED_DESTINATIONS: join(destinationAllowList, ',')
      DELAYED_DELIVERY_SHARDS: string(shards)
      DELAYED_DELIVERY_LEASE_SECONDS: string(leaseSeconds)
      DELAYED_DELIVERY_RUN_SECONDS: string(runSeconds)
      DELAYED_DELIVERY_PLACE_AHEAD: string(placeAheadSeconds)
      DELAYED_DELIVERY_ENABLED: string(enabled)
      DELAYED_DELIVERY_PENDING_CENSUS: string(pendingCensus)
      DELAYED_DELIVERY_RELEASE_RATES: string(releaseRates)
      DELAYED_DELIVERY_SCHEDULES: string(recurringSchedules)
      DELAYED_DELIVERY_SCHEDULE_TABLE_NAME: schedulesName
      DELAYED_DELIVERY_SCHEDULE_LEAD_SECONDS: string(scheduleLeadSeconds)
    })
  }
}

output functionAppName string = functionApp.outputs.name
output storageAccountName string = storage.outputs.name
output hostStorageAccountName string = hostStorage.outputs.name
output delaysTableName string = delaysName
output schedulesTableName string = schedulesName
output appInsightsName string = monitoring.outputs.appInsightsName
output identityClientId string = identity.outputs.clientId
output alertNames array = operations.outputs.alertNames
output probeQueue string = deployVerifyProbe ? verifyProbeQueue : ''

output workbookId string = operations.outputs.workbookId
