"""One timer per bucket: a lease object ``<prefix>/leases/<level>/<start ISO>`` taken with S3 conditional writes.

Taking: ``PutObject`` with ``IfNoneMatch="*"`` (only if no lease exists). A lease that exists and has expired (its
expiry is in the body) is taken over with ``PutObject`` ``IfMatch=<its ETag>``, so of two timers taking over the
same expired lease exactly one succeeds. Releasing: ``DeleteObject`` ``IfMatch=<our ETag>``, so a timer whose lease
was taken over after it expired never deletes the newer holder's lease. The design is in docs/buckets.md.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from botocore.exceptions import BotoCoreError, ClientError

from ...clock import Clock
from ...delivery import epoch_ms, from_epoch_ms
from ...errors import DelayedDeliveryError
from ...timebuckets.wheel import BucketKey
from .store import S3BucketStore, translate_s3_error

__all__ = ["DEFAULT_LEASE_SECONDS", "BucketLeases", "Lease"]

#: How long a lease holds unless released: longer than a timer run (the timer stops starting buckets before it).
DEFAULT_LEASE_SECONDS = 120.0
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_GONE = {"NoSuchKey", "404", "NotFound"}


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease held: its object key, the holder, the ETag it was written with and when it expires."""

    key: str
    owner: str
    etag: str
    expires_at: datetime


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class BucketLeases:
    """Takes and releases per-bucket leases in the store's S3 bucket (nothing is called at construction)."""

    def __init__(self, store: S3BucketStore, clock: Clock, owner: str, seconds: float = DEFAULT_LEASE_SECONDS) -> None:
        self.store = store
        self.clock = clock
        self.owner = owner
        self.seconds = seconds

    def key(self, bucket: BucketKey) -> str:
        """The lease object's key for ``bucket``."""
        return f"{self.store.prefix}/leases/{bucket.level}/{bucket.iso}"

    def _body(self, expires_at: datetime) -> bytes:
        value = {"v": 1, "owner": self.owner, "expires_at_ms": epoch_ms(expires_at), "token": uuid.uuid4().hex}
        return json.dumps(value, separators=(",", ":")).encode("utf-8")

    def _error(self, exc: BaseException, what: str) -> DelayedDeliveryError:
        return translate_s3_error(exc, what, self.store.bucket_name)

    def acquire(self, bucket: BucketKey) -> Lease | None:
        """The lease on ``bucket``, or ``None`` when another timer holds an unexpired one."""
        key = self.key(bucket)
        created = self._put(key, None)
        if created is not None:
            return created
        current = self._current(key)
        if current is None:  # released between our write and our read: one more try
            return self._put(key, None)
        etag, expires_at = current
        if expires_at is not None and expires_at > self.clock.now():
            return None
        return self._put(key, etag)

    def _put(self, key: str, replacing: str | None) -> Lease | None:
        """Write our lease: only if none exists (``replacing`` None) or only over the one with ETag ``replacing``."""
        expires_at = self.clock.now() + timedelta(seconds=self.seconds)
        condition = {"IfNoneMatch": "*"} if replacing is None else {"IfMatch": replacing}
        try:
            reply = self.store.client.put_object(
                Bucket=self.store.bucket_name, Key=key, Body=self._body(expires_at), **condition
            )
        except ClientError as exc:
            if _code(exc) in _LOST_RACE or (replacing is not None and _code(exc) in _GONE):
                return None
            raise self._error(exc, f"take lease {key}") from exc
        except BotoCoreError as exc:
            raise self._error(exc, f"take lease {key}") from exc
        return Lease(key, self.owner, str(reply["ETag"]), expires_at)

    def _current(self, key: str) -> tuple[str, datetime | None] | None:
        """The lease there now: its ETag and expiry (``None`` when unreadable: treated as expired), or ``None``."""
        try:
            reply = self.store.client.get_object(Bucket=self.store.bucket_name, Key=key)
            data = reply["Body"].read(4_096)
        except ClientError as exc:
            if _code(exc) in _GONE:
                return None
            raise self._error(exc, f"read lease {key}") from exc
        except BotoCoreError as exc:
            raise self._error(exc, f"read lease {key}") from exc
        try:
            value = json.loads(data)
            expires_ms = value["expires_at_ms"]
            expires_at = from_epoch_ms(expires_ms) if isinstance(expires_ms, int) else None
        except (ValueError, TypeError, KeyError, OverflowError, OSError, RecursionError):
            expires_at = None
        return str(reply["ETag"]), expires_at

    def release(self, lease: Lease) -> None:
        """Delete our lease, unless another timer took it over after it expired (then it is theirs to delete)."""
        try:
            self.store.client.delete_object(Bucket=self.store.bucket_name, Key=lease.key, IfMatch=lease.etag)
        except ClientError as exc:
            if _code(exc) in _LOST_RACE or _code(exc) in _GONE:
                return
            raise self._error(exc, f"release lease {lease.key}") from exc
        except BotoCoreError as exc:
            raise self._error(exc, f"release lease {lease.key}") from exc
