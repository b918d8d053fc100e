"""Operations on Azure in the Bicep, checked as text (no bicep CLI here): the alert rules, each notifying the action
group parameter; the workbook built from infra/azure/workbook.json and the query files; the Kusto queries (the same
files docs/azure.md shows) parsed by an offline KQL grammar (it knows the syntax, not the tables' schemas) and checked
against the events the code logs; the example consumer's option and roles."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from delayed_delivery import logfields as lf
from delayed_delivery.azure import blob_lease, census
from tests.infra.test_azure_bicep import INFRA, block, code, module_calls, params, source

pytestmark = pytest.mark.infra

QUERIES = INFRA / "queries"
DOCS = INFRA.parents[1] / "docs" / "azure.md"
#: Tables the queries may start from (Application Insights, classic names, as alerts on the component see them).
TABLES = {"traces", "customMetrics", "requests", "exceptions"}
#: Tabular operators the queries may use after a pipe.
OPERATORS = {"where", "extend", "summarize", "project", "order", "top", "take", "render", "distinct", "join"}
#: Events the queries filter on, each one the code logs.
EVENTS = {
    lf.EVENT_DISPATCHED,
    lf.EVENT_RETRY,
    lf.EVENT_ERROR_QUEUE,
    lf.EVENT_DUPLICATE,
    blob_lease.EVENT_LEASE_ACQUIRED,
    blob_lease.EVENT_LEASE_LOST,
    blob_lease.EVENT_LEASE_RELEASED,
    "shard_run",  # azure/runner.py, at the end of each shard's run
    "disabled",  # azure/runner.py, a run with delayed delivery switched off
    "consumed",  # the receive helpers' line per delivered message (docs/receiving.md)
    census.EVENT_PENDING_HOUR,
    census.EVENT_CENSUS,
    lf.EVENT_SCHEDULE_MISSED,  # schedules/materializer.py, occurrences recorded as missed
    lf.EVENT_TIMER_RUN,  # azure/runner.py, at the end of each timer run (with overrun_s)
    lf.EVENT_REMOVAL_FAILED,  # azure/table_store.py, a removal given up after its retries
    lf.EVENT_PLACE_NOT_WITHDRAWN,  # azure/placement.py, a placed copy that could not be withdrawn
    lf.EVENT_PLACEMENT_LAG,  # azure/placement.py, a placer's run end (with behind_s)
    lf.EVENT_SCHEDULE_FAILED,  # schedules/materializer.py and azure/schedules/timer.py, a schedule or shard failed
}
RULES = {
    "dispatch-lateness",
    "oldest-overdue",
    "error-queue",
    "lease-loss",
    "no-timer-run",
    "send-failures",
    "release-lag",
    "schedule-missed",
    "run-overrun",
    "removal-failures",
    "placement-not-withdrawn",
    "placement-lag",
    "schedule-failures",
}


def operations() -> str:
    return code(source("modules/operations.bicep"))


def rules() -> list[dict[str, str]]:
    """The ``rules`` array of operations.bicep: one dict of ``key: value`` texts per rule."""
    text = operations()
    start = text.index("var rules = [")
    body = text[start : text.index("\n]\n", start)]
    found = []
    for item in re.findall(r"^  \{\n(.*?)^  \}", body, re.MULTILINE | re.DOTALL):
        found.append(dict(re.findall(r"^\s+(\w+): (.+)$", item, re.MULTILINE)))
    return found


def loaded_files(text: str) -> list[str]:
    """Every path a Bicep text loads with loadTextContent / loadJsonContent."""
    return re.findall(r"load(?:Text|Json)Content\('([^']+)'\)", text)


def test_every_loaded_file_exists() -> None:
    for module in ("main.bicep", "modules/operations.bicep"):
        base = (INFRA / module).parent
        for path in loaded_files(source(module)):
            assert (base / path).is_file(), f"{module} loads {path}, which does not exist"
    assert len(loaded_files(source("modules/operations.bicep"))) == 23  # 9 workbook + 13 alert queries + workbook


def test_main_passes_the_operations_parameters() -> None:
    main = code(source("main.bicep"))
    path, passed = module_calls(main)["operations"]
    assert {"actionGroupId", "latenessThresholdSeconds", "timerSilenceMinutes"} <= passed
    assert path == "modules/operations.bicep"
    assert "actionGroupId: alertActionGroupId" in block(main, main.index("module operations "))
    assert "appInsightsName: monitoring.outputs.appInsightsName" in block(main, main.index("module operations "))
    declared = params(source("main.bicep"))
    for name in ("alertActionGroupId", "latenessAlertSeconds", "leaseLossAlertCount", "timerSilenceMinutes"):
        assert declared[name], f"{name} has a default: the alerts deploy without extra parameters"


def test_every_alert_notifies_the_action_group_parameter() -> None:
    text = operations()
    assert "param actionGroupId string" in text
    assert "var actionGroups = empty(actionGroupId) ? [] : [actionGroupId]" in text
    alerts = re.findall(
        r"^resource (\w+) 'Microsoft.Insights/scheduledQueryRules@[\d-]+' = \[\s*for rule in rules:", text, re.MULTILINE
    )
    assert alerts == ["alerts"], "one rule resource per entry of the rules list"
    body = block(text, text.index("resource alerts "))
    assert re.search(r"actions: \{\s*actionGroups: actionGroups\s*\}", body)
    assert "scopes: [appInsights.id]" in body and "autoMitigate: true" in body
    found = rules()
    assert {r["name"].strip("'") for r in found} == RULES
    for rule in found:
        assert set(rule) >= {
            "name",
            "description",
            "severity",
            "query",
            "timeAggregation",
            "operator",
            "threshold",
            "minutes",
        }
        assert rule["query"].startswith("loadTextContent('../queries/alert_"), rule
    by_name = {r["name"].strip("'"): r for r in found}
    silent = by_name["no-timer-run"]
    assert (silent["operator"], silent["threshold"], silent["timeAggregation"]) == ("'LessThan'", "1", "'Count'")
    assert silent["minutes"] == "timerSilenceMinutes"
    assert by_name["dispatch-lateness"]["metricMeasureColumn"] == "'lateness_s'"
    assert by_name["dispatch-lateness"]["threshold"] == "latenessThresholdSeconds"
    assert by_name["error-queue"]["threshold"] == "0" and by_name["error-queue"]["operator"] == "'GreaterThan'"


def test_alert_and_workbook_parameters_are_documented() -> None:
    for module, names in (
        (
            "main.bicep",
            (
                "alertActionGroupId",
                "latenessAlertSeconds",
                "leaseLossAlertCount",
                "timerSilenceMinutes",
                "sendFailureAlertCount",
                "pendingCensus",
                "oldestOverdueAlertSeconds",
                "deployExampleConsumer",
                "exampleConsumerQueue",
            ),
        ),
        (
            "modules/operations.bicep",
            (
                "actionGroupId",
                "latenessThresholdSeconds",
                "leaseLossThreshold",
                "timerSilenceMinutes",
                "sendFailureThreshold",
                "oldestOverdueSeconds",
            ),
        ),
    ):
        text = source(module)
        for name in names:
            assert re.search(rf"@description\('[^\n]+'\)\n(@\w+\([^\n]*\)\n)*param {name} ", text), f"{module}: {name}"
    docs = DOCS.read_text()
    for name in (
        "alertActionGroupId",
        "latenessAlertSeconds",
        "leaseLossAlertCount",
        "timerSilenceMinutes",
        "sendFailureAlertCount",
        "pendingCensus",
        "oldestOverdueAlertSeconds",
        "deployExampleConsumer",
        "exampleConsumerQueue",
    ):
        assert f"`{name}`" in docs, f"docs/azure.md does not name {name}"


def workbook() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(source("workbook.json"))
    return data


def bicep_queries() -> dict[str, str]:
    """The ``queries`` object of operations.bicep: workbook query name -> file it loads."""
    text = operations()
    body = block(text, text.index("var queries = "))
    return dict(re.findall(r"'([\w.]+)': loadTextContent\('\.\./queries/([\w.]+)'\)", body))


def test_the_workbook_is_valid_json_and_every_query_it_names_is_loaded() -> None:
    data = workbook()
    assert data["version"] == "Notebook/1.0"
    queries = [item for item in data["items"] if item["type"] == 3]
    assert {q["content"]["visualization"] for q in queries} <= {"timechart", "barchart", "table", "tiles", "grid"}
    named = {q["content"]["query"] for q in queries}
    loaded = bicep_queries()
    assert named == set(loaded), "each workbook query is one file, loaded by name"
    assert all(name == file for name, file in loaded.items())
    text = operations()
    assert "var workbookTemplate = loadJsonContent('../workbook.json')" in text
    assert "serializedData: string(union(workbookTemplate, { items: workbookItems" in text
    assert "kind: 'shared'" in text and "sourceId: appInsights.id" in text
    # what the deployment writes: the template with each query name replaced by the file's text, as JSON
    items = [
        {**i, "content": {**i["content"], "query": (QUERIES / i["content"]["query"]).read_text()}}
        if i["type"] == 3
        else i
        for i in data["items"]
    ]
    serialized = json.loads(json.dumps({**data, "items": items, "fallbackResourceIds": ["/subscriptions/x"]}))
    assert all("| " in i["content"]["query"] for i in serialized["items"] if i["type"] == 3)
    wanted = {
        "dispatch_lateness.kql",
        "consumer_lateness.kql",
        "throughput.kql",
        "error_queue.kql",
        "lease_holders.kql",
    }
    assert wanted <= named


def _strip_strings(query: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)


def all_queries() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(QUERIES.glob("*.kql"))}


@pytest.mark.parametrize("name", sorted(all_queries()))
def test_kusto_query_shape(name: str) -> None:
    """Beyond the grammar (test_kusto_query_parses): each query starts from a known table, every pipe is followed by
    a known operator, and the events and keys it filters on are the ones the code logs."""
    query = all_queries()[name]
    assert query.count('"') % 2 == 0, "unbalanced quotes"
    bare = _strip_strings(query)
    for o, c in ("()", "[]", "{}"):
        depth = 0
        for ch in bare:
            depth += (ch == o) - (ch == c)
            assert depth >= 0, f"{c} before {o}"
        assert depth == 0, f"unbalanced {o}{c}"
    lines = query.strip().splitlines()
    start = re.fullmatch(r"(?:let \w+ = )?(\w+)", lines[0].strip())
    assert start and start.group(1) in TABLES, f"starts from {lines[0]!r}"
    for step in bare.split("|")[1:]:
        word = step.split()[0]
        assert word in OPERATORS, f"unknown operator {word!r}"
    assert "ago(" not in query, "the time range is the workbook's or the alert window's"
    for event in re.findall(r"customDimensions\.event (?:==|in) \(?([^)\n]+)", query):
        assert set(re.findall(r'"(\w+)"', event)) <= EVENTS, event
    keys = set(re.findall(r"customDimensions\.(\w+)", query))
    known = {v for k, v in vars(lf).items() if k.isupper() and isinstance(v, str)}
    known |= {census.CENSUS_AT, census.DUE_HOUR, census.PENDING, census.OLDEST_OVERDUE_S}
    assert keys <= known, keys - known


def test_docs_show_the_query_files() -> None:
    """docs/azure.md shows each query file under a ``<!-- query: name.kql -->`` marker, text for text."""
    docs = DOCS.read_text()
    shown = dict(re.findall(r"<!-- query: ([\w.]+) -->\n```kusto\n(.*?)```", docs, re.DOTALL))
    queries = all_queries()
    assert set(shown) == set(queries), (set(queries) - set(shown), set(shown) - set(queries))
    for name, text in shown.items():
        assert text == queries[name], f"docs/azure.md shows another {name}"
    assert "## Operating on Azure" in docs


def test_the_example_consumer_is_an_option_with_roles_on_its_queue_only() -> None:
    main = code(source("main.bicep"))
    assert re.search(r"^param deployExampleConsumer bool = false$", main, re.MULTILINE)
    assert "module consumer 'modules/consumer.bicep' = if (deployExampleConsumer)" in main
    assert "var exampleConsumerSettings = deployExampleConsumer" in main
    assert "appSettings: union(exampleConsumerSettings, {" in main
    settings = block(main, main.index("var exampleConsumerSettings"))
    assert "DELAYED_DELIVERY_EXAMPLE_CONSUMER_QUEUE: exampleConsumerQueue" in settings
    assert "DelayedDeliveryQueues__credential: 'managedidentity'" in settings
    consumer = code(source("modules/consumer.bicep"))
    roles = dict(re.findall(r"^var (\w+) = '([0-9a-f-]{36})'$", consumer, re.MULTILINE))
    assert roles == {
        "queueReader": "19e7f393-937e-4f77-808e-94535e297925",
        "messageProcessor": "8a0f0c08-91a1-4084-bc3d-661d67233fed",
        "messageSender": "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a",
    }
    scopes = re.findall(
        r"roleAssignments@[\d-]+' = \{\s*scope: (\w+)\s*name: guid\(\1\.id, principalId, (\w+)\)", consumer
    )
    assert sorted(scopes) == [
        ("consumerQueue", "messageProcessor"),
        ("consumerQueue", "queueReader"),
        ("poisonQueue", "messageSender"),
    ]
    assert "name: '${queueName}-poison'" in consumer


def kusto_syntax_errors(query: str) -> list[str]:
    """Syntax errors from an offline KQL grammar (kusto-query-language-parser, ANTLR): empty when it parses."""
    from antlr4 import CommonTokenStream, InputStream
    from antlr4.error.ErrorListener import ErrorListener
    from kusto_query_language_parser.parse_tools.KqlLexer import KqlLexer
    from kusto_query_language_parser.parse_tools.KqlParser import KqlParser

    errors: list[str] = []

    class Collect(ErrorListener):
        def syntaxError(self, recognizer: Any, symbol: Any, line: int, column: int, msg: str, e: Any) -> None:
            errors.append(f"{line}:{column} {msg}")

    lexer = KqlLexer(InputStream(query))
    lexer.removeErrorListeners()
    lexer.addErrorListener(Collect())
    parser = KqlParser(CommonTokenStream(lexer))
    parser.removeErrorListeners()
    parser.addErrorListener(Collect())
    parser.top()
    return errors


@pytest.mark.parametrize("name", sorted(all_queries()))
def test_kusto_query_parses(name: str) -> None:
    assert kusto_syntax_errors(all_queries()[name]) == []


@pytest.mark.parametrize(
    "broken",
    ["traces | summarize count( by x", 'traces | where a == "x', "traces | extend a = ", "traces | where | take 5"],
)
def test_the_kusto_grammar_catches_broken_queries(broken: str) -> None:
    assert kusto_syntax_errors(broken)
