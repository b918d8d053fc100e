"""Entity-group transactions with a lean request body (the dispatcher's and the migration's hot paths).

``azure-data-tables`` builds a transaction by running every operation through its request pipeline and
then through the ``email`` package, both ways: about 0.4 ms of CPU per operation, which on Azurite costs the
dispatcher more than the Put Message calls it settles. ``submit`` writes the same multipart body directly
(the wire format the SDK itself sends) and sends it through the table client's own pipeline, so
authentication, retries and timeouts are unchanged.

Guarantee: the outcome is the SDK's. Only a transaction whose every operation succeeded is answered here;
anything else (a conflict, a missing entity, a throttled call, an unexpected response, a key or client the
lean form does not cover) is submitted again through ``TableClient.submit_transaction``, which raises
exactly what it always raised. A failed transaction changes nothing, so submitting it again is safe.
Either way ``submit`` returns each operation's new ETag (None for a delete, or where the response names none),
so a later write can be conditional on exactly what this one wrote.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from azure.core.rest import HttpRequest
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode

__all__ = ["Operation", "submit"]

Operation = tuple[str, dict[str, Any], dict[str, Any]]

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,255}$")
_PART_STATUS = re.compile(rb"^HTTP/1\.1 (\d{3})", re.MULTILINE)
_PART_ETAG = re.compile(rb"^ETag: *(\S[^\r\n]*)", re.MULTILINE | re.IGNORECASE)


def submit(table: TableClient, operations: Sequence[Operation]) -> list[str | None]:
    """Commit ``operations`` as one transaction (lean body when possible, else through the SDK); their new ETags."""
    body = _lean_body(table, operations)
    if body is not None:
        etags = _send(table, *body, len(operations))
        if etags is not None:
            return etags
    results = table.submit_transaction(list(operations))
    return [_etag_of(r) for r in results] if len(results) == len(operations) else [None] * len(operations)


def _etag_of(result: object) -> str | None:
    etag = result.get("etag") if isinstance(result, Mapping) else None
    return etag if isinstance(etag, str) and etag else None


def _lean_body(table: TableClient, operations: Sequence[Operation]) -> tuple[str, bytes] | None:
    """``(batch boundary, body)``, or None when an operation is outside what the lean form covers.

    Covered: ``delete`` (with or without an ETag), ``update`` in merge or replace mode, ``create`` and ``upsert`` in
    replace mode, over entities whose values are strings, 32-bit integers, bytes or ``Edm.Int64`` properties.
    """
    try:
        if getattr(table, "_query_str", "") or not operations:
            return None  # SAS-signed URLs and empty transactions: leave them to the SDK
        base = f"{table.scheme}://{table._primary_hostname}/{table.table_name}"
        version = table.api_version
    except AttributeError:
        return None
    batch, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
    parts = [f"--{batch}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n"]
    for n, (kind, entity, kwargs) in enumerate(operations):
        pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
        if not (isinstance(pk, str) and isinstance(rk, str) and _PLAIN_KEY.match(pk) and _PLAIN_KEY.match(rk)):
            return None
        etag = kwargs.get("etag")
        if etag is not None and not (isinstance(etag, str) and etag.isprintable() and "\n" not in etag):
            return None
        url = f"{base}(PartitionKey='{pk}',RowKey='{rk}')"
        head = (
            f"--{changeset}\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary\r\n"
            f"Content-ID: {n}\r\n\r\n"
        )
        if kind == "delete" and set(kwargs) <= {"etag", "match_condition"}:
            parts.append(
                f"{head}DELETE {url} HTTP/1.1\r\nx-ms-version: {version}\r\nDataServiceVersion: 3.0\r\n"
                f"Accept: application/json;odata=minimalmetadata\r\nIf-Match: {etag or '*'}\r\n\r\n\r\n"
            )
            continue
        if kind == "update" and kwargs.get("mode") == UpdateMode.MERGE:
            request = f"PATCH {url} HTTP/1.1\r\nIf-Match: {etag or '*'}\r\n"
        elif kind == "update" and kwargs.get("mode") == UpdateMode.REPLACE:
            request = f"PUT {url} HTTP/1.1\r\nIf-Match: {etag or '*'}\r\n"
        elif kind == "create" and not kwargs:
            request = f"POST {base} HTTP/1.1\r\nPrefer: return-no-content\r\n"
        elif kind == "upsert" and kwargs == {"mode": UpdateMode.REPLACE}:
            request = f"PUT {url} HTTP/1.1\r\n"
        else:
            return None
        payload = _entity_json(entity)
        if payload is None:
            return None
        parts.append(
            f"{head}{request}Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            f"x-ms-version: {version}\r\nDataServiceVersion: 3.0\r\nAccept: application/json\r\n\r\n"
            f"{payload.decode('ascii')}\r\n"
        )
    parts.append(f"--{changeset}--\r\n\r\n--{batch}--\r\n")
    return batch, "".join(parts).encode()


def _entity_json(entity: dict[str, Any]) -> bytes | None:
    """The entity as the service's JSON (ASCII-escaped), or None for a value this form does not write.

    Strings and 32-bit integers need no type annotation (they are ``Edm.String`` and ``Edm.Int32``);
    bytes are base64 with ``Edm.Binary``; an ``EntityProperty`` of ``Edm.Int64`` is its decimal text with the type.
    """
    out: dict[str, Any] = {}
    for key, value in entity.items():
        if isinstance(value, bool) or not key.isidentifier():
            return None
        if isinstance(value, str) or (isinstance(value, int) and -(2**31) <= value < 2**31):
            out[key] = value
        elif isinstance(value, EntityProperty) and value.edm_type == EdmType.INT64 and _is_int(value.value):
            out[key] = str(value.value)
            out[f"{key}@odata.type"] = "Edm.Int64"
        elif isinstance(value, bytes):
            out[key] = base64.b64encode(value).decode("ascii")
            out[f"{key}@odata.type"] = "Edm.Binary"
        else:
            return None
    return json.dumps(out, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _send(table: TableClient, boundary: str, body: bytes, expected: int) -> list[str | None] | None:
    """Each operation's new ETag when the service committed the transaction; None to let the SDK submit (and judge)
    it."""
    request = HttpRequest(
        "POST",
        f"{table.scheme}://{table._primary_hostname}/$batch",
        headers={
            "x-ms-version": table.api_version,
            "DataServiceVersion": "3.0",
            "MaxDataServiceVersion": "3.0;NetFx",
            "Content-Type": f"multipart/mixed; boundary={boundary}",
            "Accept": "application/json",
        },
        content=body,
    )
    response = table._client.send_request(request, stream=True)
    try:
        if response.status_code != 202:
            return None
        content = response.read()
    finally:
        response.close()
    starts = [m.start() for m in _PART_STATUS.finditer(content)]
    statuses = _PART_STATUS.findall(content)
    if len(statuses) != expected or not all(s.startswith(b"2") for s in statuses):
        return None
    etags: list[str | None] = []
    for start, end in zip(starts, [*starts[1:], len(content)], strict=True):  # parts answer in request order
        found = _PART_ETAG.search(content, start, end)
        etags.append(found.group(1).decode("ascii", "replace").strip() if found else None)
    return etags
