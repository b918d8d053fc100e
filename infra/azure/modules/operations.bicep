// Operations on Azure: log alert rules on Application Insights, each notifying the action group given, and a
// workbook. Every query is a file in ../queries (docs/azure.md shows the same files).
param namePrefix string
param location string
param tags object = {}
param appInsightsName string
@description('Action group every alert notifies; empty: the alerts fire in the portal only.')
param actionGroupId string
@description('Alert when a dispatched message was later than this (seconds) after its due time.')
param latenessThresholdSeconds int
@description('Alert when more than this many shard leases were lost within 15 minutes.')
param leaseLossThreshold int
@description('Alert when no timer run finished for this many minutes.')
@allowed([5, 10, 15, 30, 45])
param timerSilenceMinutes int
@description('Alert when more than this many sends failed within 5 minutes.')
param sendFailureThreshold int
@description('Alert when the census finds a row overdue by more than this (seconds); needs the census timer.')
param oldestOverdueSeconds int
@description('Alert when release control adds more than this (seconds) to a message (its release lag).')
param releaseLagSeconds int
@description('Alert when a timer run lasted more than this (seconds) beyond its budget (the next run is late).')
param runOverrunSeconds int
@description('Alert when placement ends a run this far (seconds) inside its lead: rows near the end of it go out late.')
param placementLagSeconds int

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

var actionGroups = empty(actionGroupId) ? [] : [actionGroupId]

var queries = {
  'dispatch_lateness.kql': loadTextContent('../queries/dispatch_lateness.kql')
  'consumer_lateness.kql': loadTextContent('../queries/consumer_lateness.kql')
  'throughput.kql': loadTextContent('../queries/throughput.kql')
  'failures.kql': loadTextContent('../queries/failures.kql')
  'error_queue.kql': loadTextContent('../queries/error_queue.kql')
  'lease_holders.kql': loadTextContent('../queries/lease_holders.kql')
  'pending_by_due_hour.kql': loadTextContent('../queries/pending_by_due_hour.kql')
  'release_lag.kql': loadTextContent('../queries/release_lag.kql')
  'schedules.kql': loadTextContent('../queries/schedules.kql')
  none: ''
}

// One rule per condition: name, description, severity, query file, aggregation, measured column, operator,
// threshold, window (minutes).
var rules = [
  {
    name: 'dispatch-lateness'
    description: 'A delayed message was dispatched more than ${latenessThresholdSeconds} s after its due time.'
    severity: 2
    query: loadTextContent('../queries/alert_dispatch_lateness.kql')
    timeAggregation: 'Maximum'
    metricMeasureColumn: 'lateness_s'
    operator: 'GreaterThan'
    threshold: latenessThresholdSeconds
    minutes: 5
  }
  {
    name: 'oldest-overdue'
    description: 'A pending row has been overdue for more than ${oldestOverdueSeconds} s (the census, every 15 minutes).'
    severity: 2
    query: loadTextContent('../queries/alert_oldest_overdue.kql')
    timeAggregation: 'Maximum'
    metricMeasureColumn: 'oldest_overdue_s'
    operator: 'GreaterThan'
    threshold: oldestOverdueSeconds
    minutes: 30
  }
  {
    name: 'release-lag'
    description: 'Release control holds messages back more than ${releaseLagSeconds} s: a capped destination has a backlog (release_rates).'
    severity: 2
    query: loadTextContent('../queries/alert_release_lag.kql')
    timeAggregation: 'Maximum'
    metricMeasureColumn: 'release_lag_s'
    operator: 'GreaterThan'
    threshold: releaseLagSeconds
    minutes: 5
  }
  {
    name: 'run-overrun'
    description: 'A timer run lasted more than ${runOverrunSeconds} s beyond its budget: the next run starts late.'
    severity: 2
    query: loadTextContent('../queries/alert_run_overrun.kql')
    timeAggregation: 'Maximum'
    metricMeasureColumn: 'overrun_s'
    operator: 'GreaterThan'
    threshold: runOverrunSeconds
    minutes: 15
  }
  {
    name: 'placement-lag'
    description: 'Placement ended a run ${placementLagSeconds} s or more inside its lead (placeAheadSeconds): rows it has not reached by their due time are sent from then, late.'
    severity: 2
    query: loadTextContent('../queries/alert_placement_lag.kql')
    timeAggregation: 'Maximum'
    metricMeasureColumn: 'behind_s'
    operator: 'GreaterThan'
    threshold: placementLagSeconds
    minutes: 15
  }
  {
    name: 'removal-failures'
    description: 'Removing sent messages from the table failed after its retries: up to 100 each are sent again (duplicates).'
    severity: 2
    query: loadTextContent('../queries/alert_removal_failed.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: 0
    minutes: 15
  }
  {
    name: 'placement-not-withdrawn'
    description: 'A message placed ahead on its queue lost its row and could not be withdrawn: it may arrive twice.'
    severity: 3
    query: loadTextContent('../queries/alert_place_not_withdrawn.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: 0
    minutes: 15
  }
  {
    name: 'error-queue'
    description: 'Messages arrived on the error queue.'
    severity: 1
    query: loadTextContent('../queries/alert_error_queue.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: 0
    minutes: 5
  }
  {
    name: 'lease-loss'
    description: 'More than ${leaseLossThreshold} shard leases were lost within 15 minutes.'
    severity: 2
    query: loadTextContent('../queries/alert_lease_lost.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: leaseLossThreshold
    minutes: 15
  }
  {
    name: 'no-timer-run'
    description: 'No timer run finished for ${timerSilenceMinutes} minutes: due messages are not being dispatched.'
    severity: 1
    query: loadTextContent('../queries/alert_timer_runs.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'LessThan'
    threshold: 1
    minutes: timerSilenceMinutes
  }
  {
    name: 'schedule-missed'
    description: 'Occurrences of a recurring schedule were recorded as missed (the timer was down past its catch-up policy).'
    severity: 2
    query: loadTextContent('../queries/alert_schedule_missed.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: 0
    minutes: 15
  }
  {
    name: 'schedule-failures'
    description: 'The recurring-schedule timer failed on a schedule or a shard (retried every run; a schedule that keeps failing does not fire).'
    severity: 2
    query: loadTextContent('../queries/alert_schedule_failures.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: 0
    minutes: 15
  }
  {
    name: 'send-failures'
    description: 'More than ${sendFailureThreshold} sends to destination queues failed within 5 minutes.'
    severity: 2
    query: loadTextContent('../queries/alert_send_failures.kql')
    timeAggregation: 'Count'
    metricMeasureColumn: null
    operator: 'GreaterThan'
    threshold: sendFailureThreshold
    minutes: 5
  }
]

resource alerts 'Microsoft.Insights/scheduledQueryRules@2023-12-01' = [
  for rule in rules: {
    name: '${namePrefix}-${rule.name}'
    location: location
    tags: tags
    properties: {
      displayName: '${namePrefix}: ${rule.name}'
      description: rule.description
      severity: rule.severity
      enabled: true
      scopes: [appInsights.id]
      evaluationFrequency: 'PT5M'
      windowSize: 'PT${rule.minutes}M'
      criteria: {
        allOf: [
          {
            query: rule.query
            timeAggregation: rule.timeAggregation
            metricMeasureColumn: rule.metricMeasureColumn
            operator: rule.operator
            threshold: rule.threshold
            failingPeriods: {
              numberOfEvaluationPeriods: 1
              minFailingPeriodsToAlert: 1
            }
          }
        ]
      }
      autoMitigate: true
      actions: {
        actionGroups: actionGroups
      }
    }
  }
]

// The workbook's queries are file names in ../workbook.json, replaced here by the files' text. Text items have no
// query: they map to 'none' so the replacement is safe whichever branch is evaluated.
var workbookTemplate = loadJsonContent('../workbook.json')
var workbookItems = map(
  workbookTemplate.items,
  item =>
    item.type == 3 ? union(item, { content: union(item.content, { query: queries[item.content.?query ?? 'none'] }) }) : item
)

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, namePrefix, 'delayed-delivery-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'Delayed delivery (${namePrefix})'
    category: 'workbook'
    sourceId: appInsights.id
    serializedData: string(union(workbookTemplate, { items: workbookItems, fallbackResourceIds: [appInsights.id] }))
  }
}

output alertNames array = [for (rule, i) in rules: alerts[i].name]
output workbookId string = workbook.id
