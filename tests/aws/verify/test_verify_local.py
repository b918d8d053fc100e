"""``aws verify`` end to end on moto (HTTPS), the functions run locally: a healthy deployment passes quick and full;
each broken one (a missing DLQ, visibility too short, a missing bucket policy, a probe never arriving) is reported
with its fix and exit 1; the JSON is one document, the human report a table with one line per finding."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.aws.verify.conftest import by_check, cli, client, verify
from tests.aws.verify.policy import Call, allowed
from tests.docs.verify_checks import assert_documented

pytestmark = pytest.mark.moto

PROBE = "delayed-delivery-probe"


def _failures(document: dict) -> dict[str, dict]:
    return {c["check"]: c for c in document["checks"] if c["status"] == "fail"}


def test_a_healthy_deployment_passes_quick(deployed_tls: str) -> None:
    deployed = deployed_tls
    code, document, err = verify(deployed)
    checks = by_check(document)
    assert code == 0 and document["ok"] and not _failures(document), _failures(document)
    native = checks[("probe-native", PROBE)]
    assert native["status"] == "pass" and -1 < native["data"]["lateness_s"] < 5, native
    assert checks[("tier-bucket-policy", "verify-tier")]["status"] == "pass"  # set over HTTPS by aws create
    assert checks[("probe-delay-fifo", PROBE)]["status"] == "skipped"
    # what an emulator cannot show is listed with what it will check
    account = {c["check"] for c in document["checks"] if c["status"] == "needs a real account"}
    assert {"event-source", "function-role", "tier-schedule", "alarms", "probe-visibility-12h"} <= account
    assert checks[("cost", "probes")]["data"]["sqs_requests"] >= 3
    assert "sending 1 probe(s)" in err
    assert_documented(document)
    # the probe endpoint verify made for the run is gone again
    queues = client("sqs", deployed).list_queues(QueueNamePrefix=PROBE).get("QueueUrls", [])
    assert queues == []


def test_a_healthy_deployment_passes_full_through_every_route(deployed: str, verify_calls: list[Call]) -> None:
    code, document, err = verify(deployed, "--full")
    checks = by_check(document)
    assert code == 0 and not _failures(document), [(c["evidence"], c["fix"]) for c in _failures(document).values()]
    for kind, route in (("native", "native"), ("delay-fifo", "fifo"), ("tier", "buckets"), ("reschedule", "fifo")):
        found = checks[(f"probe-{kind}", PROBE)]
        assert found["status"] == "pass" and found["data"]["route"] == route, (found, err)
        assert found["data"]["arrivals"] == 1 and found["data"]["lateness_s"] > -1, found
    assert checks[("probe-cancel", PROBE)]["status"] == "pass"
    assert_documented(document)
    assert checks[("tier-bucket-policy", "verify-tier")]["status"] == "needs a real account"  # plain HTTP
    assert "waiting for" in err  # progress while the probes are in flight
    # every request verify made is allowed by the policy docs/verify.md gives (the cloud's own calls: test_policy.py)
    assert {c.action for c in verify_calls} >= {"sqs:SendMessage", "sqs:ChangeMessageVisibility", "dynamodb:PutItem"}
    assert [c for c in verify_calls if not allowed(c)] == []


def _fails_with(endpoint: str, check: str, evidence: str, fix: str) -> None:
    code, document, _ = verify(endpoint)
    found = _failures(document)
    assert code == 1 and not document["ok"] and check in found, document["checks"]
    assert evidence in found[check]["evidence"] and fix in found[check]["fix"], found[check]


def test_a_missing_dlq_is_reported_with_its_fix(deployed: str) -> None:
    sqs = client("sqs", deployed)
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="delayed-delivery-ingest-dlq")["QueueUrl"])
    _fails_with(deployed, "tier-ingest-dlq", "does not exist", "RedrivePolicy")


def test_visibility_too_short_is_reported_with_its_fix(deployed: str) -> None:
    sqs = client("sqs", deployed)
    url = sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "30"})
    _fails_with(
        deployed,
        "delay-queue-visibility",
        "visibility 30 s < 6 × function timeout 30 s",
        "raise VisibilityTimeout to 180",
    )


def test_retention_that_loses_messages_fails_verify_as_it_fails_check(deployed: str) -> None:
    """60 s on the ingest queue (its batching window is 300 s: every record would expire unread), its DLQ and the error
    queue: before (issue 32) verify passed all three while `aws check` failed the ingest queue."""
    sqs = client("sqs", deployed)
    urls = {
        n: sqs.get_queue_url(QueueName=n)["QueueUrl"]
        for n in ("delayed-delivery-ingest", "delayed-delivery-ingest-dlq", "error")
    }
    for url in urls.values():
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"MessageRetentionPeriod": "60"})
    code, document, _ = verify(deployed)
    found = _failures(document)
    assert code == 1 and {"tier-ingest-retention", "tier-error-queue", "error-queue"} <= set(found), found
    ingest = found["tier-ingest-retention"]
    assert "records expire before the ingest function takes them" in ingest["evidence"], ingest
    assert "ingest dead-letter queue 'delayed-delivery-ingest-dlq'" in ingest["evidence"], ingest
    for name in ("delayed-delivery-ingest", "delayed-delivery-ingest-dlq"):
        assert f"--queue-url {urls[name]} --attributes MessageRetentionPeriod=1209600" in ingest["fix"], ingest
    for check in ("tier-error-queue", "error-queue"):
        assert "error queue 'error': MessageRetentionPeriod below 1209600 s (14 days): 60 s" in found[check]["evidence"]
        assert (
            found[check]["fix"]
            == f"aws sqs set-queue-attributes --queue-url {urls['error']} --attributes MessageRetentionPeriod=1209600"
        )
    assert_documented(document)
    # `aws check` says the same about the same queues
    code, out, _ = cli("aws", "check", "--queue", "orders", "--buckets", "--endpoint-url", deployed)
    said = " ".join(out.split())
    assert code == 1, out
    for check in ("tier-ingest-retention", "tier-error-queue"):
        for sentence in found[check]["evidence"].split("; ")[::2]:
            assert sentence.split(": ", 1)[0] in said, (sentence, out)
    assert "records expire before the ingest function takes them" in said, out


def test_a_deleted_delay_queue_is_reported_with_the_command_that_recreates_it(deployed: str) -> None:
    """Discovery on an emulator reads what `aws create` recorded (a tag on the endpoint's queues), not a listing of
    `*-delay.fifo`: before (issue 32) an endpoint whose `-delay.fifo` was deleted was not checked at all (exit 0)."""
    sqs = client("sqs", deployed)
    sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"])
    _fails_with(
        deployed,
        "delay-queue",
        "delay queue 'orders-delay.fifo' does not exist",
        "delayed-delivery aws create --queue orders",
    )


def test_a_missing_bucket_policy_is_reported_with_its_fix(deployed_tls: str) -> None:
    client("s3", deployed_tls).delete_bucket_policy(Bucket="verify-tier")
    _fails_with(deployed_tls, "tier-bucket-policy", "no bucket policy", "aws:SecureTransport")


def test_a_probe_never_arriving_is_reported_with_where_it_is_and_the_fix(
    deployed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe endpoint exists, but its -delay.fifo holds every hop 60 s instead of the function's 2 s."""
    monkeypatch.setenv("DELAYED_DELIVERY_CANCELLATION_TABLE", "")  # no cancel / reschedule probes: not this test's
    monkeypatch.setenv("DELAYED_DELIVERY_VERIFY_GRACE", "3")
    code, out, err = cli(
        "aws", "create", "--queue", PROBE, "--error-queue", f"{PROBE}-errors", "--endpoint-url", deployed
    )
    assert code == 0, out + err
    sqs = client("sqs", deployed)
    url = sqs.get_queue_url(QueueName=f"{PROBE}-delay.fifo")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "60"})
    code, document, _ = cli_verify_full_without_tier(deployed)
    failure = _failures(document)["probe-delay-fifo"]
    assert code == 1 and "never arrived" in failure["evidence"], failure
    assert f"waits out DelaySeconds 60 s on {PROBE}-delay.fifo" in failure["evidence"], failure
    assert failure["fix"] == f"set DelaySeconds of {PROBE}-delay.fifo to 2 (the requeue function's hop)", failure
    assert by_check(document)[("probe-native", PROBE)]["status"] == "pass"
    # the probe endpoint was there before the run: verify leaves it
    assert sqs.get_queue_url(QueueName=PROBE)["QueueUrl"]


def cli_verify_full_without_tier(endpoint: str) -> tuple[int, dict, str]:
    code, out, err = cli("aws", "verify", "--endpoint-url", endpoint, "--no-buckets", "--full", "--json")
    return code, json.loads(out), err


def test_the_human_report_is_a_table_with_one_line_per_finding_and_its_fix(deployed: str) -> None:
    sqs = client("sqs", deployed)
    url = sqs.get_queue_url(QueueName="orders-delay.fifo")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "5"})
    code, out, _ = cli("aws", "verify", "--endpoint-url", deployed, "--buckets")
    assert code == 1
    lines = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(lines) == 1 and "delay-queue orders-delay.fifo" in lines[0], out
    assert lines[0].endswith("→ fix: set DelaySeconds to 2"), out
    assert "Needs a real account" in out and "exit 1" in out.splitlines()[-1]


def test_usage_errors_exit_2_with_one_line() -> None:
    code, out, err = cli("aws", "verify", "--queue", "orders", "--region", "us-east-1")
    assert code == 2 and "--local" in err and len(err.strip().splitlines()) == 1, (out, err)


def _cannot_start(document: dict, err: str, reason: str) -> None:
    """Exit 3: one JSON document saying nothing was checked and why, one error line on stderr."""
    assert document["exit_code"] == 3 and document["ok"] is False and document["checks"] == [], document
    assert reason in document["error"] and len(err.strip().splitlines()) == 1 and reason in err, (document, err)


def test_an_unreachable_endpoint_is_one_json_document_and_exit_3() -> None:
    """Before (issue 32): exit 2, documented for usage errors, and nothing on stdout."""
    code, out, err = cli("aws", "verify", "--endpoint-url", "https://127.0.0.1:9", "--json")
    assert code == 3, (out, err)
    _cannot_start(json.loads(out), err, "the emulator at https://127.0.0.1:9 could not be reached")
    code, out, err = cli("aws", "verify", "--endpoint-url", "https://127.0.0.1:9")
    assert code == 3 and out == "" and err.startswith("error: "), (out, err)


def test_a_refused_credential_is_one_json_document_and_exit_3(deployed: str) -> None:
    """moto checks signatures once told to (moto-api/reset-auth): the key 'testing' is then unknown."""
    import urllib.request

    def auth(count: str) -> None:
        request = urllib.request.Request(f"{deployed}/moto-api/reset-auth", data=count.encode(), method="POST")
        request.add_header("Content-Type", "text/plain")
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200

    auth("0")
    try:
        code, document, err = verify(deployed)
    finally:
        auth("inf")
    assert code == 3
    _cannot_start(document, err, f"the emulator at {deployed} refused the credential (InvalidClientTokenId)")


def test_sigterm_mid_run_cleans_up_and_reports_the_interruption(deployed: str) -> None:
    """SIGTERM (or Ctrl-C) while a probe is in flight: the probe endpoint and the temporary queue verify made are
    deleted, the JSON document says interrupted, exit 1."""
    env = {**os.environ, "DELAYED_DELIVERY_VERIFY_NATIVE_DELAY": "60"}
    command = str(Path(sys.executable).parent / "delayed-delivery")
    argv = [command, "aws", "verify", "--endpoint-url", deployed, "--json"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:  # wait until the probe is in flight
        if "sending 1 probe(s)" in line:
            break
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    document = json.loads(out)
    assert process.returncode == 1 and document["interrupted"] and not document["cleanup_problems"], (out, err)
    names = [u.rsplit("/", 1)[-1] for u in client("sqs", deployed).list_queues().get("QueueUrls", [])]
    assert not [n for n in names if n.startswith(("delayed-delivery-probe", "delayed-delivery-verify-"))], names
