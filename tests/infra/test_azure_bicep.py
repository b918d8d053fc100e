"""The Azure Bicep, checked as text (no bicep CLI here): wiring, identity-only access, least roles on the narrowest
scopes, the destination allow-list default, public network access as a parameter, Flex Consumption."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from delayed_delivery.azure import config as azure_config
from delayed_delivery.azure import function_host
from delayed_delivery.azure.blob_lease import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from delayed_delivery.azure.destinations import DestinationPolicy, parse_patterns
from delayed_delivery.azure.schedules import config as schedule_config
from delayed_delivery.naming import azure_delays_table_name
from delayed_delivery.settings import DelayedDeliverySettings

pytestmark = pytest.mark.infra

INFRA = Path(__file__).resolve().parents[2] / "infra" / "azure"
MODULES = ("identity", "storage", "hoststorage", "monitoring", "roles", "functionapp", "operations", "consumer")

ROLES = {
    "b7e6dc6d-f1e8-4753-8033-0f2253ddb2a6": "Storage Blob Data Owner",
    "ba92f5b4-2d11-453d-a403-e96b0029c9fe": "Storage Blob Data Contributor",
    "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3": "Storage Table Data Contributor",
    "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a": "Storage Queue Data Message Sender",
    "3913510d-42f4-4e42-8a64-420c390055eb": "Monitoring Metrics Publisher",
}
BROAD_ROLES = {
    "8e3af657-a8ff-443c-a75c-2fe8c4bcb635": "Owner",
    "b24988ac-6180-42a0-ab88-20f7382dd24c": "Contributor",
    "17d1049b-9a84-46fb-8f53-869881c3d3ab": "Storage Account Contributor",
    "974c5e8b-45b9-4653-ba55-5f855dd0fb88": "Storage Queue Data Contributor",
    "8a0f0c08-91a1-4084-bc3d-661d67233fed": "Storage Queue Data Message Processor",
    "19e7f393-937e-4f77-808e-94535e297925": "Storage Queue Data Reader",
}


def source(name: str) -> str:
    return (INFRA / name).read_text()


def code(text: str) -> str:
    """Bicep without comments and description strings, for matching code only."""
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"@description\('(?:[^'\\]|\\.)*'\)", "", text)


def params(text: str) -> dict[str, bool]:
    """Declared params: name -> has a default."""
    return {
        m.group(1): m.group(2) is not None
        for m in re.finditer(r"^param (\w+) [\w.]+(\s*=.*)?$", code(text), re.MULTILINE)
    }


def block(text: str, start: int) -> str:
    """The balanced ``{...}`` beginning at the first ``{`` from ``start``."""
    open_at = text.index("{", start)
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at : i + 1]
    raise AssertionError("unbalanced braces")


def module_calls(text: str) -> dict[str, tuple[str, set[str]]]:
    """Module symbol -> (path, names passed in its params block)."""
    calls = {}
    for m in re.finditer(r"^module (\w+) '([^']+)' = ", text, re.MULTILINE):
        body = block(text, m.end())
        p = body.index("params:")
        passed = block(body, p)
        names = set(re.findall(r"^\s{4}(\w+):", passed, re.MULTILINE))
        calls[m.group(1)] = (m.group(2), names)
    return calls


def all_bicep() -> str:
    return "\n".join(code(source(f)) for f in ["main.bicep", *(f"modules/{m}.bicep" for m in MODULES)])


def test_files_exist_and_brackets_balance() -> None:
    for name in ["main.bicep", *(f"modules/{m}.bicep" for m in MODULES)]:
        text = code(source(name))
        for o, c in ("{}", "[]", "()"):
            assert text.count(o) == text.count(c), f"{name}: unbalanced {o}{c}"
        assert text.count("'") % 2 == 0, f"{name}: unbalanced quotes"
    json.loads(source("bicepconfig.json"))


def test_every_module_call_matches_the_module_parameters() -> None:
    calls = module_calls(code(source("main.bicep")))
    assert {Path(path).stem for path, _ in calls.values()} == set(MODULES)
    for symbol, (path, passed) in calls.items():
        declared = params(source(path))
        assert passed <= set(declared), f"{symbol}: unknown params {passed - set(declared)}"
        required = {n for n, has_default in declared.items() if not has_default}
        assert required <= passed, f"{symbol}: missing params {required - passed}"


def test_parameters_file_fits_main_and_names_follow_the_naming_scheme() -> None:
    values = {k: v["value"] for k, v in json.loads(source("main.parameters.json"))["parameters"].items()}
    declared = params(source("main.bicep"))
    assert set(values) <= set(declared)
    assert {n for n, d in declared.items() if not d} <= set(values), "every required parameter has a value"
    assert values["delaysName"] == azure_delays_table_name(values["endpointName"])
    assert MIN_LEASE_SECONDS <= values["leaseSeconds"] <= MAX_LEASE_SECONDS


def test_parameter_ranges_agree_with_the_code() -> None:
    main = source("main.bicep")
    lease = re.search(r"@minValue\((\d+)\)\s*@maxValue\((\d+)\)\s*param leaseSeconds", main)
    assert lease and (int(lease.group(1)), int(lease.group(2))) == (MIN_LEASE_SECONDS, MAX_LEASE_SECONDS)
    run = re.search(r"@maxValue\((\d+)\)\s*param runSeconds", main)
    assert run and int(run.group(1)) < 60, "a run ends before the next one-minute tick"
    ahead = re.search(r"@minValue\((\d+)\)\s*@maxValue\((\d+)\)\s*param placeAheadSeconds int = (\d+)", main)
    assert ahead and (int(ahead.group(1)), int(ahead.group(2))) == (0, azure_config.MAX_PLACE_AHEAD)
    assert int(ahead.group(3)) == 7200, "placed two hours ahead by default (docs/azure.md, Placing ahead)"
    assert "DELAYED_DELIVERY_PLACE_AHEAD: string(placeAheadSeconds)" in main


def test_no_keys_or_shared_key_access_anywhere() -> None:
    text = all_bicep()
    for forbidden in (
        "listKeys",
        "AccountKey",
        "accountKey",
        "primaryKey",
        "InstrumentationKey=",
        "SharedAccessSignature",
    ):
        assert forbidden not in text
    storage = code(source("modules/storage.bicep"))
    assert "allowSharedKeyAccess: false" in storage
    assert "allowBlobPublicAccess: false" in storage
    assert "DisableLocalAuth: true" in code(source("modules/monitoring.bicep"))


def test_function_app_uses_identity_based_connections_on_flex_consumption() -> None:
    app = code(source("modules/functionapp.bicep"))
    assert "name: 'FC1'" in app and "tier: 'FlexConsumption'" in app
    assert re.search(r"runtime: \{\s*name: 'python'\s*version: '3.11'", app)
    assert "AzureWebJobsStorage__accountName: hostStorageName" in app
    assert "AzureWebJobsStorage__credential: 'managedidentity'" in app
    assert "AzureWebJobsStorage__clientId: identityClientId" in app
    assert not re.search(r"^\s*AzureWebJobsStorage:", app, re.MULTILINE), "no connection-string host storage"
    assert "type: 'UserAssignedIdentity'" in app, "the deployment package is read with the identity"
    assert "Authorization=AAD" in app, "telemetry ingestion with Entra ID"
    assert "FUNCTIONS_WORKER_RUNTIME" not in app, "Flex Consumption rejects it: the runtime is in functionAppConfig"
    assert "type: 'UserAssigned'" in app


def test_app_settings_are_the_ones_the_code_reads() -> None:
    text = all_bicep()
    used = set(re.findall(r"\b(DELAYED_DELIVERY_\w+):", text))
    known = {v for k, v in vars(azure_config).items() if k.startswith("ENV_") and isinstance(v, str)}
    known |= {env for _, env, _, _ in DelayedDeliverySettings.reference()}
    known |= {function_host.ENV_EXAMPLE_CONSUMER_QUEUE, function_host.ENV_PENDING_CENSUS, function_host.ENV_SCHEDULES}
    known |= {v for k, v in vars(schedule_config).items() if k.startswith("ENV_") and isinstance(v, str)}
    assert used and used <= known, f"settings the code never reads: {used - known}"
    assert {"DELAYED_DELIVERY_STORAGE_ACCOUNT", "DELAYED_DELIVERY_TABLE_NAME", "DELAYED_DELIVERY_ENABLED"} <= used


def test_the_destination_allow_list_defaults_to_the_endpoints_own_queues_and_is_never_empty() -> None:
    main = code(source("main.bicep"))
    assert "param allowedDestinations array = destinationQueues" in main
    assert (
        "var destinationAllowList = union(empty(allowedDestinations) ? [errorQueueName] : allowedDestinations, "
        "probeQueues)" in main
    ), "the verify probe's queue (test_azure_probe.py) is added to whatever list applies"
    assert f"{azure_config.ENV_ALLOWED}: join(destinationAllowList, ',')" in main
    assert "join(allowedDestinations" not in main, "an empty list would reach the app and mean any queue"
    # the value the template passes for an empty list allows the error queue only
    policy = DestinationPolicy("error", parse_patterns("error", azure_config.ENV_ALLOWED))
    assert policy.refusal("orders") is not None and policy.refusal("error") is None


def _assignments(roles: str) -> dict[str, tuple[str, str, str]]:
    """Role assignment symbol -> (scope, role definition variable, condition or loop header)."""
    found = {}
    for m in re.finditer(r"resource (\w+) 'Microsoft.Authorization/roleAssignments@[\d-]+' = ([^{]*)\{", roles):
        body = block(roles, m.end() - 1)
        scope = re.search(r"^\s*scope: ([\w\[\]]+)$", body, re.MULTILINE)
        role = re.search(r"roleDefinitions', (\w+)\)", body)
        assert scope and role, m.group(1)
        assert f"guid({scope.group(1)}.id, principalId, {role.group(1)})" in body, "the name follows the scope"
        found[m.group(1)] = (scope.group(1), role.group(1), " ".join(m.group(2).split()))
    return found


def _role_ids(roles: str) -> dict[str, str]:
    """Role definition variable -> GUID."""
    return dict(re.findall(r"^var (\w+) = '([0-9a-f-]{36})'$", roles, re.MULTILINE))


def _existing_parent(roles: str, symbol: str) -> tuple[str, str, str]:
    """An ``existing`` resource: (type, parent symbol or '', name expression)."""
    m = re.search(rf"resource {symbol} '([\w./]+)@[\d-]+' existing = (\[\s*for [^:]+:\s*)?\{{", roles)
    assert m, symbol
    body = block(roles, m.end() - 1)
    parent = re.search(r"parent: (\w+)", body)
    name = re.search(r"name: (.+)$", body, re.MULTILINE)
    assert name
    return m.group(1), parent.group(1) if parent else "", name.group(1).strip()


def test_identity_gets_exactly_the_least_data_plane_roles() -> None:
    roles = code(source("modules/roles.bicep"))
    ids = _role_ids(roles)
    assert set(ids.values()) == set(ROLES), {g: ROLES.get(g, BROAD_ROLES.get(g, "?")) for g in set(ids.values())}
    # the example consumer's reader and processor roles, on its own queue only: test_azure_operations.py
    consumer = code(source("modules/consumer.bicep"))
    assert not set(BROAD_ROLES) & set(re.findall(r"[0-9a-f-]{36}", all_bicep().replace(consumer, "")))
    granted = {name: (scope, ROLES[ids[role]], header) for name, (scope, role, header) in _assignments(roles).items()}
    assert granted == {
        "hostBlobOwner": ("hostAccount", "Storage Blob Data Owner", ""),
        "tableContributor": ("delaysTable", "Storage Table Data Contributor", ""),
        "schedulesTableContributor": ("schedulesTable", "Storage Table Data Contributor", "if (!empty(schedulesName))"),
        "leaseContributor": ("leaseContainer", "Storage Blob Data Contributor", ""),
        "queueSenders": (
            "queues[i]",
            "Storage Queue Data Message Sender",
            "[ for i in range(0, length(senderQueues)): if (queueSenderScope == 'queues')",
        ),
        "accountQueueSender": ("account", "Storage Queue Data Message Sender", "if (queueSenderScope == 'account')"),
        "telemetryPublisher": ("appInsights", "Monitoring Metrics Publisher", ""),
    }
    assert roles.count("principalType: 'ServicePrincipal'") == len(granted)


def test_every_storage_role_is_scoped_to_the_resource_it_needs() -> None:
    roles = code(source("modules/roles.bicep"))
    assert _existing_parent(roles, "delaysTable") == (
        "Microsoft.Storage/storageAccounts/tableServices/tables",
        "tableService",
        "delaysName",
    )
    assert _existing_parent(roles, "tableService")[1] == "account"
    assert _existing_parent(roles, "leaseContainer") == (
        "Microsoft.Storage/storageAccounts/blobServices/containers",
        "blobService",
        "delaysName",
    )
    assert _existing_parent(roles, "blobService")[1] == "account"
    assert _existing_parent(roles, "queues") == (
        "Microsoft.Storage/storageAccounts/queueServices/queues",
        "queueService",
        "queue",
    )
    assert re.search(r"resource queues '[^']+' existing = \[\s*for queue in senderQueues:", roles)
    assert _existing_parent(roles, "account") == ("Microsoft.Storage/storageAccounts", "", "storageName")
    assert _existing_parent(roles, "hostAccount") == ("Microsoft.Storage/storageAccounts", "", "hostStorageName")
    assert re.search(r"@allowed\(\['queues', 'account'\]\)\s*param queueSenderScope string$", roles, re.MULTILINE)
    main = code(source("main.bicep"))
    assert re.search(r"@allowed\(\['queues', 'account'\]\)\s*param queueSenderScope string = 'queues'", main)
    roles_call = block(main, main.index("module roles "))
    # the identity sends to the destination queues the template creates (the verify probe's among them) and the
    # error queue, nowhere else
    assert "senderQueues: union(createdQueues, [errorQueueName])" in roles_call
    assert "var createdQueues = union(destinationQueues, probeQueues)" in main
    assert "queueSenderScope: queueSenderScope" in roles_call
    assert "hostStorageName: hostStorage.outputs.name" in roles_call
    assert "storageName: storage.outputs.name" in roles_call


def test_the_host_has_its_own_storage_account_apart_from_the_delays() -> None:
    main = code(source("main.bicep"))
    names = dict(re.findall(r"^var (storageName|hostStorageName) = (.+)$", main, re.MULTILINE))
    assert names["storageName"] != names["hostStorageName"] and "'host'" in names["hostStorageName"]
    app = code(source("modules/functionapp.bicep"))
    assert "AzureWebJobsStorage__accountName: hostStorageName" in app
    assert "DELAYED_DELIVERY_STORAGE_ACCOUNT: storageName" in app
    app_call = block(main, main.index("module functionApp "))
    assert "hostStorageName: hostStorage.outputs.name" in app_call
    assert "blobEndpoint: hostStorage.outputs.blobEndpoint" in app_call, "the deployment package is on the host"
    host = code(source("modules/hoststorage.bicep"))
    assert re.search(r"containers@[\d-]+' = \{\s*parent: blobService\s*name: deploymentContainer", host)
    assert "tableServices" not in host and "queueServices" not in host
    storage = code(source("modules/storage.bicep"))
    assert "deploymentContainer" not in storage, "the delays account holds no host or deployment blobs"


def test_public_network_access_is_a_documented_parameter_of_both_accounts() -> None:
    main = code(source("main.bicep"))
    assert re.search(
        r"@allowed\(\['Enabled', 'Disabled'\]\)\s*param publicNetworkAccess string = 'Enabled'$", main, re.MULTILINE
    )
    assert "@description('Public network access" in source("main.bicep")
    for module, symbol in (("storage", "storage"), ("hoststorage", "hostStorage")):
        text = code(source(f"modules/{module}.bicep"))
        assert "publicNetworkAccess: publicNetworkAccess" in text
        assert "'Enabled'" not in text.replace("@allowed(['Enabled', 'Disabled'])", ""), "no hard-coded value"
        assert "publicNetworkAccess: publicNetworkAccess" in block(main, main.index(f"module {symbol} "))
    docs = (INFRA.parents[1] / "docs" / "azure.md").read_text()
    assert "publicNetworkAccess" in docs and "private endpoint" in docs


def test_storage_provisions_the_delays_table_lease_container_and_error_queue() -> None:
    storage = code(source("modules/storage.bicep"))
    assert re.search(r"tableServices/tables@[\d-]+' = \{\s*parent: tableService\s*name: delaysName", storage)
    assert re.search(r"containers@[\d-]+' = \{\s*parent: blobService\s*name: delaysName", storage)
    assert re.search(r"queues@[\d-]+' = \{\s*parent: queueService\s*name: errorQueueName", storage)
    main = code(source("main.bicep"))
    assert "Microsoft.Insights/components" in code(source("modules/monitoring.bicep"))
    assert "WorkspaceResourceId: workspace.id" in code(source("modules/monitoring.bicep"))
    assert "dependsOn: [roles, consumer]" in main, "the app starts only after its roles exist"
