"""S3 and SQS in memory behind real boto3 clients, each request charged AWS's latency on a simulated clock.

The burst model runs the tier's own code (timer, workers) against these: boto3 builds and serializes every request
as it would for AWS; a ``before-call`` hook answers it from memory instead of the network. Each simulated Lambda
invocation has a ``SimTime``: its seconds are the CPU seconds its process used since it started, times
``cpu_scale`` (a Lambda's share of a core at its memory size), plus every request's latency
(``benchmarks.aws_costs.LATENCY``: S3 100 ms, SQS 20 ms), plus ``client_cpu`` per request (what the hook skips:
signing, the HTTP exchange, parsing the reply, measured against moto by ``calibrate_client_cpu``). SendMessageBatch
calls made side by side (``bucket_send_threads``) are charged ``1/threads`` of their latency each; a GetObject made
ahead (the worker opens the next object while it reads the current one) only the part of its latency not yet spent.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from botocore.awsrequest import AWSResponse
from botocore.response import StreamingBody

__all__ = ["FakeAws", "Sends", "SimClock", "SimTime", "calibrate_client_cpu"]

REGION = "us-east-1"
ACCOUNT = "123456789012"


class SimTime:
    """One simulated invocation's time: CPU seconds used (scaled) plus the latency of its requests."""

    def __init__(self, start: datetime, cpu_scale: float) -> None:
        self.start = start
        self.cpu_scale = cpu_scale
        self.cpu0 = time.process_time()
        self.waited = 0.0
        self.lock = threading.Lock()
        self.last_get = -1e9

    def seconds(self) -> float:
        """Simulated seconds since ``start``."""
        return (time.process_time() - self.cpu0) * self.cpu_scale + self.waited

    def now(self) -> datetime:
        """Simulated now."""
        return self.start + timedelta(seconds=self.seconds())

    def wait(self, seconds: float) -> None:
        """Charge ``seconds`` of waiting (a request's latency)."""
        with self.lock:
            self.waited += seconds


class SimClock:
    """The ``Clock`` port over a ``SimTime`` (``sleep`` is charged, not slept)."""

    def __init__(self, sim: SimTime) -> None:
        self.sim = sim

    def now(self) -> datetime:
        """Simulated now."""
        return self.sim.now()

    def sleep(self, seconds: float) -> None:
        """Charge the sleep."""
        self.sim.wait(max(0.0, seconds))


@dataclass
class Sends:
    """What reached the destination queues: per message index, the first visible time and how many copies."""

    count: int
    first_visible: list[float] = field(default_factory=list)
    copies: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.first_visible = [0.0] * self.count
        self.copies = bytearray(self.count)

    #: The last send (epoch seconds, simulated).
    last_send: float = 0.0

    def record(self, index: int, sent: float, visible: float) -> None:
        """One copy of message ``index`` sent at ``sent``, visible at ``visible`` (epoch seconds)."""
        self.last_send = max(self.last_send, sent)
        if self.copies[index] == 0:
            self.first_visible[index] = visible
        if self.copies[index] < 255:
            self.copies[index] += 1


def _response(status: int = 200) -> AWSResponse:
    return AWSResponse(f"https://fake.{REGION}.amazonaws.com/", status, {}, None)


def _error(code: str, status: int, message: str = "") -> tuple[AWSResponse, dict[str, Any]]:
    return _response(status), {
        "Error": {"Code": code, "Message": message or code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }


class FakeAws:
    """One account's S3 objects and SQS queues in memory, and the hooks that answer boto3 clients from them."""

    def __init__(
        self,
        *,
        latency: dict[str, float],
        client_cpu: float = 0.0,
        message_index: Callable[[dict[str, Any]], int] | None = None,
        sends: Sends | None = None,
    ) -> None:
        self.latency = latency
        self.client_cpu = client_cpu
        self.objects: dict[tuple[str, str], tuple[bytes, str]] = {}
        self.queues: dict[str, list[tuple[float, str]]] = {}
        self.requests: Counter[str] = Counter()
        self.message_index = message_index
        self.sends = sends
        self.lock = threading.Lock()
        #: The simulated time requests are charged to (set per invocation by the model).
        self.sim: SimTime | None = None
        #: SendMessageBatch calls in flight side by side (their latency is shared).
        self.send_threads = 1

    # --- clients ------------------------------------------------------------------------------------------------
    def client(self, service: str) -> Any:
        """A real boto3 client whose requests this object answers."""
        import boto3

        made = boto3.client(
            service,
            region_name=REGION,
            endpoint_url=f"https://fake.{REGION}.amazonaws.com",
            aws_access_key_id="x",
            aws_secret_access_key="x",
        )
        made.meta.events.register(f"before-parameter-build.{service}.*", self._keep)
        made.meta.events.register(f"before-call.{service}.*", self._answer)
        return made

    def create_queue(self, name: str) -> str:
        self.queues.setdefault(name, [])
        return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"

    @staticmethod
    def _keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["fake_params"] = dict(params)

    def _answer(self, model: Any, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        operation = model.name
        service = model.service_model.service_name
        params = context.get("fake_params", {})
        self.requests[f"{service}.{operation}"] += 1
        self._charge(service, operation)
        handler = getattr(self, f"_{service}_{operation}", None)
        if handler is None:
            raise NotImplementedError(f"{service} {operation} is not modelled")
        result: tuple[AWSResponse, dict[str, Any]] = handler(params)
        return result

    def _charge(self, service: str, operation: str) -> None:
        sim = self.sim
        if sim is None:
            return
        latency = self.latency["s3" if service == "s3" else "sqs"]
        if operation == "SendMessageBatch":
            latency /= self.send_threads
        if operation == "GetObject":  # opened ahead: only what is left of its latency since the last one
            now = sim.seconds()
            with sim.lock:
                ahead = max(0.0, now - sim.last_get)
                sim.last_get = now
            latency = max(0.0, latency - ahead)
        sim.wait(latency + self.client_cpu * sim.cpu_scale)

    # --- S3 -----------------------------------------------------------------------------------------------------
    def put(self, bucket: str, key: str, data: bytes) -> str:
        etag = '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + uuid.uuid4().hex[:6] + '"'
        self.objects[(bucket, key)] = (data, etag)
        return etag

    def _s3_PutObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        body = p.get("Body", b"")
        data = body.encode() if isinstance(body, str) else bytes(body.read() if hasattr(body, "read") else body)
        where = (p["Bucket"], p["Key"])
        with self.lock:
            current = self.objects.get(where)
            if p.get("IfNoneMatch") == "*" and current is not None:
                return _error("PreconditionFailed", 412)
            if "IfMatch" in p and (current is None or current[1] != p["IfMatch"]):
                return _error("PreconditionFailed" if current else "NoSuchKey", 412 if current else 404)
            etag = self.put(*where, data)
        return _response(), {"ETag": etag}

    def _s3_GetObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        found = self.objects.get((p["Bucket"], p["Key"]))
        if found is None:
            return _error("NoSuchKey", 404)
        data, etag = found
        return _response(), {
            "Body": StreamingBody(io.BytesIO(data), len(data)),
            "ETag": etag,
            "ContentLength": len(data),
        }

    def _s3_DeleteObjects(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        with self.lock:
            for item in p["Delete"]["Objects"]:
                self.objects.pop((p["Bucket"], item["Key"]), None)
        return _response(), {"Deleted": [{"Key": item["Key"]} for item in p["Delete"]["Objects"]]}

    def _s3_DeleteObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        with self.lock:
            current = self.objects.get((p["Bucket"], p["Key"]))
            if current is not None and "IfMatch" in p and current[1] != p["IfMatch"]:
                return _error("PreconditionFailed", 412)
            self.objects.pop((p["Bucket"], p["Key"]), None)
        return _response(204), {}

    def _s3_CopyObject(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        source = p["CopySource"]
        found = self.objects.get((source["Bucket"], source["Key"]))
        if found is None:
            return _error("NoSuchKey", 404)
        self.put(p["Bucket"], p["Key"], found[0])
        return _response(), {}

    def _s3_HeadBucket(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        return _response(), {}

    def _s3_ListObjectsV2(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        prefix, bucket = p.get("Prefix", ""), p["Bucket"]
        after = p.get("ContinuationToken") or p.get("StartAfter") or ""
        delimiter = p.get("Delimiter")
        keys = sorted(k for b, k in list(self.objects) if b == bucket and k.startswith(prefix) and k > after)
        common: list[str] = []
        if delimiter:
            common = sorted({prefix + k[len(prefix) :].split(delimiter)[0] + delimiter
                             for k in keys if delimiter in k[len(prefix) :]})  # fmt: skip
            keys = [k for k in keys if delimiter not in k[len(prefix) :]]
        page = keys[: p.get("MaxKeys", 1000)]
        reply: dict[str, Any] = {
            "Contents": [{"Key": k, "Size": len(self.objects[(bucket, k)][0])} for k in page],
            "IsTruncated": len(keys) > len(page),
            "KeyCount": len(page),
        }
        if common:
            reply["CommonPrefixes"] = [{"Prefix": c} for c in common]
        if reply["IsTruncated"]:
            reply["NextContinuationToken"] = page[-1]
        return _response(), reply

    # --- SQS ----------------------------------------------------------------------------------------------------
    def _sqs_GetQueueUrl(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        if p["QueueName"] not in self.queues:
            return _error("AWS.SimpleQueueService.NonExistentQueue", 400)
        return _response(), {"QueueUrl": f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{p['QueueName']}"}

    def _sqs_GetQueueAttributes(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        attributes = {"MaximumMessageSize": "1048576", "MessageRetentionPeriod": "345600", "VisibilityTimeout": "30"}
        return _response(), {"Attributes": attributes}

    def _sqs_SendMessageBatch(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        name = str(p["QueueUrl"]).rsplit("/", 1)[-1]
        at = self.sim.start.timestamp() + self.sim.seconds() if self.sim is not None else 0.0
        ok = []
        for entry in p["Entries"]:
            ok.append({"Id": entry["Id"], "MessageId": uuid.uuid4().hex, "MD5OfMessageBody": ""})
            index = self.message_index(entry) if self.message_index is not None else -1
            if self.sends is not None and index >= 0:
                with self.lock:
                    self.sends.record(index, at, at + entry.get("DelaySeconds", 0))
            else:
                with self.lock:
                    self.queues.setdefault(name, []).append((at, entry["MessageBody"]))
        return _response(), {"Successful": ok, "Failed": []}


def calibrate_client_cpu(endpoint: str, calls: int = 30) -> float:
    """CPU seconds a real boto3 request costs the caller beyond what the hook path costs (signing, HTTP, parsing):
    the same SendMessageBatch sent to moto at ``endpoint`` (a fresh queue a round: moto slows as a queue fills) and
    answered by a ``FakeAws`` hook; the least of three rounds each."""
    import boto3

    real = boto3.client(
        "sqs", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    fake = FakeAws(latency={"s3": 0.0, "sqs": 0.0})
    hooked = fake.client("sqs")
    entries = [{"Id": str(n), "MessageBody": "x" * 1024, "DelaySeconds": 5} for n in range(10)]

    def cpu(client: Any, queue: str) -> float:
        start = time.process_time()
        for _ in range(calls):
            client.send_message_batch(QueueUrl=queue, Entries=entries)
        return (time.process_time() - start) / calls

    spent = []
    for _ in range(4):  # the first round warms the connection pool and the endpoint resolution
        url = real.create_queue(QueueName=f"calibrate-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        spent.append(cpu(real, url))
        real.delete_queue(QueueUrl=url)
    base = min(cpu(hooked, fake.create_queue("calibrate")) for _ in range(3))
    return max(0.0, min(spent[1:]) - base)
