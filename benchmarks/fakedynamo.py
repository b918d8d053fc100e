"""DynamoDB in a SQLite database behind a real boto3 client: the schedule timer's requests, answered and counted.

Like ``benchmarks/fakeaws.py`` (S3 and SQS), a ``before-call`` hook answers each request boto3 builds, so the code
under test is the product's own. Items live in SQLite (``:memory:``, or a file, so a million schedules stay out of
the measured process's memory), keyed by ``(pk, sk)`` in key order as DynamoDB keeps them. The hook answers the
operations the schedules table uses (Get/Put/Delete/Update with the shard lease's expressions, Query on a key
prefix, BatchGet, BatchWrite, TransactWrite) and nothing else, and counts what AWS bills: read request units
(per 4 KB, half for eventually consistent reads; a Query's items summed), write request units (per 1 KB of the
larger of the old and new item, twice inside a transaction), per operation. Each request is charged the assumed
AWS latency (``benchmarks.aws_costs.LATENCY``: DynamoDB 10 ms) on the invocation's ``SimTime`` when one is set.
"""

from __future__ import annotations

import math
import pickle
import sqlite3
import threading
from collections import Counter
from typing import Any

from botocore.awsrequest import AWSResponse

from benchmarks.fakeaws import REGION, SimTime
from delayed_delivery.aws.schedules import lease

__all__ = ["FakeDynamo", "item_bytes"]


def _response(status: int = 200) -> AWSResponse:
    return AWSResponse(f"https://fake.{REGION}.amazonaws.com/", status, {}, None)


def _error(code: str, status: int = 400, **extra: Any) -> tuple[AWSResponse, dict[str, Any]]:
    return _response(status), {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status},
                               **extra}  # fmt: skip


def _value_bytes(value: dict[str, Any]) -> int:
    ((kind, v),) = value.items()
    if kind == "S":
        return len(v.encode("utf-8"))
    if kind == "N":
        return len(v.lstrip("-").replace(".", "")) // 2 + 1
    if kind == "B":
        return len(v)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(_value_bytes(x) + 1 for x in v)
    if kind == "M":
        return 3 + sum(len(k) + _value_bytes(x) + 1 for k, x in v.items())
    raise NotImplementedError(kind)


def item_bytes(item: dict[str, Any] | None) -> int:
    """DynamoDB's size of an item: attribute names plus values (as its documentation counts them)."""
    if not item:
        return 0
    return sum(len(name.encode()) + _value_bytes(value) for name, value in item.items())


def _wru(*sizes: int) -> int:
    return max(1, math.ceil(max(sizes) / 1024))


class FakeDynamo:
    """One table's items in SQLite, and the hooks that answer a boto3 DynamoDB client from them."""

    def __init__(self, path: str = ":memory:", latency: float = 0.010, client_cpu: float = 0.0) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA cache_size=-16000")  # 16 MB of pages: the table stays on disk
        self.db.execute("CREATE TABLE IF NOT EXISTS items (pk TEXT, sk TEXT, item BLOB, PRIMARY KEY (pk, sk))"
                        " WITHOUT ROWID")  # fmt: skip
        self.lock = threading.RLock()
        self.latency = latency
        self.client_cpu = client_cpu
        self.requests: Counter[str] = Counter()
        self.rru: Counter[str] = Counter()
        self.wru: Counter[str] = Counter()
        self.sim: SimTime | None = None

    def client(self) -> Any:
        """A real boto3 DynamoDB client answered by this table."""
        import boto3

        made = boto3.client("dynamodb", region_name=REGION, endpoint_url=f"https://fake.{REGION}.amazonaws.com",
                            aws_access_key_id="x", aws_secret_access_key="x")  # fmt: skip
        made.meta.events.register("before-parameter-build.dynamodb.*", self._keep)
        made.meta.events.register("before-call.dynamodb.*", self._answer)
        return made

    # -- storage ---------------------------------------------------------------------------------------------

    def get(self, pk: str, sk: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT item FROM items WHERE pk = ? AND sk = ?", (pk, sk)).fetchone()
        return None if row is None else pickle.loads(row[0])

    def put(self, item: dict[str, Any]) -> None:
        self.db.execute("INSERT OR REPLACE INTO items VALUES (?, ?, ?)",
                        (item["pk"]["S"], item["sk"]["S"], pickle.dumps(item, protocol=5)))  # fmt: skip

    def put_many(self, items: list[dict[str, Any]]) -> None:
        """Load items (setting a benchmark up: not counted)."""
        with self.lock:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO items VALUES (?, ?, ?)",
                                [(i["pk"]["S"], i["sk"]["S"], pickle.dumps(i, protocol=5)) for i in items])  # fmt: skip
            self.db.execute("COMMIT")

    def delete(self, pk: str, sk: str) -> None:
        self.db.execute("DELETE FROM items WHERE pk = ? AND sk = ?", (pk, sk))

    def count(self, prefix: str) -> int:
        """Items whose partition key starts with ``prefix``."""
        return int(self.db.execute("SELECT count(*) FROM items WHERE pk >= ? AND pk < ?",
                                   (prefix, prefix + "\uffff")).fetchone()[0])  # fmt: skip

    # -- the hooks -------------------------------------------------------------------------------------------

    @staticmethod
    def _keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["fake_params"] = dict(params)

    def _answer(self, model: Any, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        operation = model.name
        self.requests[operation] += 1
        if self.sim is not None:
            self.sim.wait(self.latency + self.client_cpu * self.sim.cpu_scale)
        handler = getattr(self, f"_{operation}", None)
        if handler is None:
            raise NotImplementedError(f"DynamoDB {operation} is not modelled")
        with self.lock:
            result: tuple[AWSResponse, dict[str, Any]] = handler(context.get("fake_params", {}))
        return result

    def _read(self, operation: str, size: int, consistent: bool) -> None:
        units = max(1, math.ceil(size / 4096))
        self.rru[operation] += units if consistent else units / 2

    def _GetItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        item = self.get(p["Key"]["pk"]["S"], p["Key"]["sk"]["S"])
        self._read("GetItem", item_bytes(item), bool(p.get("ConsistentRead")))
        return _response(), ({"Item": item} if item else {})

    def _BatchGetItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        out: dict[str, list[Any]] = {}
        for table, request in p["RequestItems"].items():
            found = out.setdefault(table, [])
            for key in request["Keys"]:
                item = self.get(key["pk"]["S"], key["sk"]["S"])
                self._read("BatchGetItem", item_bytes(item), bool(request.get("ConsistentRead")))
                if item is not None:
                    found.append(item)
        return _response(), {"Responses": out, "UnprocessedKeys": {}}

    def _Query(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        values = p["ExpressionAttributeValues"]
        condition = p["KeyConditionExpression"]
        pk = values[":p"]["S"]
        sql, args = "SELECT sk, item FROM items WHERE pk = ?", [pk]
        if "sk < :b" in condition:
            sql, args = sql + " AND sk < ?", [*args, values[":b"]["S"]]
        elif "sk > :a" in condition:
            sql, args = sql + " AND sk > ?", [*args, values[":a"]["S"]]
        elif condition.strip() != "pk = :p":
            raise NotImplementedError(condition)
        start = p.get("ExclusiveStartKey")
        if start:
            sql, args = sql + " AND sk > ?", [*args, start["sk"]["S"]]
        limit = int(p.get("Limit", 1_000_000))
        rows = self.db.execute(sql + " ORDER BY sk LIMIT ?", [*args, limit + 1]).fetchall()
        items, size = [], 0
        for _, blob in rows[:limit]:
            item = pickle.loads(blob)
            size += item_bytes(item)
            if size > 1024 * 1024 and items:  # 1 MB a response
                break
            items.append(item)
        self._read("Query", size, bool(p.get("ConsistentRead")))
        reply: dict[str, Any] = {"Items": items, "Count": len(items)}
        if len(items) < len(rows):
            reply["LastEvaluatedKey"] = {"pk": items[-1]["pk"], "sk": items[-1]["sk"]}
        return _response(), reply

    def _PutItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        item = p["Item"]
        old = self.get(item["pk"]["S"], item["sk"]["S"])
        self.wru["PutItem"] += _wru(item_bytes(item), item_bytes(old))
        self.put(item)
        return _response(), {}

    def _BatchWriteItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        for requests in p["RequestItems"].values():
            for r in requests:
                item = r["PutRequest"]["Item"]
                old = self.get(item["pk"]["S"], item["sk"]["S"])
                self.wru["BatchWriteItem"] += _wru(item_bytes(item), item_bytes(old))
                self.put(item)
        return _response(), {"UnprocessedItems": {}}

    def _DeleteItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        key = (p["Key"]["pk"]["S"], p["Key"]["sk"]["S"])
        old = self.get(*key)
        self.wru["DeleteItem"] += _wru(item_bytes(old))
        self.delete(*key)
        return _response(), ({"Attributes": old} if old and p.get("ReturnValues") == "ALL_OLD" else {})

    def _UpdateItem(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        """The shard lease's updates (``aws/schedules/lease.py``), exactly those."""
        key = (p["Key"]["pk"]["S"], p["Key"]["sk"]["S"])
        old = self.get(*key) or {"pk": p["Key"]["pk"], "sk": p["Key"]["sk"]}
        v = p.get("ExpressionAttributeValues", {})
        expression, condition = p["UpdateExpression"], p.get("ConditionExpression")
        until = old.get("until", {}).get("N")
        owner = old.get("owner", {}).get("S")
        held = until is not None and int(until) >= int(v.get(":now", {"N": "0"})["N"]) and owner != v[":o"]["S"]
        if (condition == lease.ACQUIRE_IF and held) or (condition == lease.OWNED and owner != v[":o"]["S"]):
            return _error("ConditionalCheckFailedException")
        new = dict(old)
        sets = {
            lease.ACQUIRE: {"owner": ":o", "until": ":u"},
            lease.BEGIN: {"pass_now": ":p", "pass_done": ":f"},
            lease.JOURNAL: {"pass_pages": ":b", "pass_written": ":f"},
            lease.BEGIN_JOURNAL: {"pass_now": ":p", "pass_done": ":f", "pass_pages": ":b", "pass_written": ":f"},
            lease.WRITTEN: {"pass_written": ":t"},
            lease.FINISH: {"pass_done": ":t", "until": ":zero"},
            lease.RELEASE: {"until": ":zero"},
        }.get(expression)
        if sets is None:
            raise NotImplementedError(expression)
        new.update({name: v[value] for name, value in sets.items()})
        if expression == lease.FINISH:
            new.pop("pass_pages", None)
            new.pop("pass_written", None)
        self.wru["UpdateItem"] += _wru(item_bytes(new), item_bytes(old))
        self.put(new)
        return _response(), ({"Attributes": old} if p.get("ReturnValues") == "ALL_OLD" else {})

    def _TransactWriteItems(self, p: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
        reasons, actions = [], []
        for action in p["TransactItems"]:
            ((kind, body),) = action.items()
            key = body["Item"] if kind == "Put" else body["Key"]
            old = self.get(key["pk"]["S"], key["sk"]["S"])
            condition = body.get("ConditionExpression")
            ok = True
            if condition == "attribute_not_exists(pk)":
                ok = old is None
            elif condition == "rev = :r":
                ok = old is not None and old.get("rev", {}).get("N") == body["ExpressionAttributeValues"][":r"]["N"]
            elif condition is not None:
                raise NotImplementedError(condition)
            reasons.append({"Code": "None" if ok else "ConditionalCheckFailed"})
            actions.append((kind, body, old))
        if any(r["Code"] != "None" for r in reasons):
            return _error("TransactionCanceledException", CancellationReasons=reasons)
        for kind, body, old in actions:
            if kind == "Put":
                self.wru["TransactWriteItems"] += 2 * _wru(item_bytes(body["Item"]), item_bytes(old))
                self.put(body["Item"])
            else:
                self.wru["TransactWriteItems"] += 2 * _wru(item_bytes(old))
                self.delete(body["Key"]["pk"]["S"], body["Key"]["sk"]["S"])
        return _response(), {}
