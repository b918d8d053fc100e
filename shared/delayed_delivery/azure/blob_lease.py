"""One active dispatcher per shard: a lease on the blob ``shard-NNN`` in the delays container.

Settings: ``duration`` (15–60 s, the service's range), ``renew_every`` (default a fifth of the
duration, at most 4 s). Guarantees: while ``keep_going()`` is True this process held the lease at its last
successful renewal, and that renewal is less than ``duration - margin`` seconds old. A background
thread renews the lease; the moment a renewal fails (lease broken, taken, or storage unreachable)
``keep_going()`` returns False for good, so the dispatcher stops before sending anything else.
A holder that dies simply stops renewing: another process acquires the lease once it expires.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError, ResourceNotFoundError

from .. import logfields as lf
from ..errors import ConfigurationError
from ..naming import validate_azure_container_name
from ..validation import is_whole
from .sdk_errors import translate

if TYPE_CHECKING:  # the blob SDK loads when a lease is taken (reading the lease limits stays light)
    from azure.storage.blob import BlobLeaseClient, ContainerClient

__all__ = ["MAX_LEASE_SECONDS", "MIN_LEASE_SECONDS", "BlobLease", "lease_blob_name"]

MIN_LEASE_SECONDS = 15
MAX_LEASE_SECONDS = 60
EVENT_LEASE_ACQUIRED = "lease_acquired"
EVENT_LEASE_LOST = "lease_lost"
EVENT_LEASE_RELEASED = "lease_released"

_log = logging.getLogger("delayed_delivery.azure.lease")


def lease_blob_name(shard: int) -> str:
    """The blob whose lease guards ``shard``."""
    return f"shard-{shard:03d}"


class BlobLease:
    """A renewable blob lease; ``keep_going`` is the dispatcher's stop signal."""

    def __init__(
        self,
        container: ContainerClient,
        shard: int = 0,
        *,
        duration: int = MIN_LEASE_SECONDS,
        renew_every: float | None = None,
        margin: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        blob_name: str | None = None,
    ) -> None:
        # blob_name: another lease than the shard's dispatcher lease (the schedule timer's ``schedules-NN``)
        if not is_whole(duration, MIN_LEASE_SECONDS, MAX_LEASE_SECONDS):
            raise ConfigurationError(
                f"lease duration must be a whole number of seconds from {MIN_LEASE_SECONDS} to "
                f"{MAX_LEASE_SECONDS}, got {duration!r}"
            )
        validate_azure_container_name(container.container_name)
        self.container = container
        self.shard = shard
        self.blob = container.get_blob_client(blob_name or lease_blob_name(shard))
        self.duration = duration
        # every 4 s at most: an idle HTTP keep-alive connection (Node's default: 5 s) is never reused stale
        self.renew_every = renew_every if renew_every is not None else min(duration / 5, 4.0)
        if not 0 < self.renew_every < duration - margin:
            raise ConfigurationError("renew_every must be positive and shorter than the lease duration minus margin")
        self.margin = margin
        self._monotonic = monotonic
        self._client: BlobLeaseClient | None = None
        #: One lease id for this object's life: re-acquiring after a failed renewal succeeds at once
        #: if the lease is in fact still ours, and fails (409) if someone else took it.
        self._lease_id = str(uuid.uuid4())
        self._valid_until = 0.0
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0

    @property
    def held(self) -> bool:
        """True while the lease is believed held (acquired, not lost, not released)."""
        return self._client is not None and not self._lost.is_set()

    @property
    def lease_id(self) -> str | None:
        """The current lease id, if any."""
        return None if self._client is None else self._client.id

    def setup_infrastructure(self) -> None:
        """Create the container and the shard's lease blob if missing."""
        try:
            self.container.create_container()
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 403:  # 403: least-privilege identity; the container is provisioned (Bicep)
                raise translate(exc, f"creating container {self.container.container_name}") from exc
        except AzureError as exc:
            raise translate(exc, f"creating container {self.container.container_name}") from exc
        self._ensure_blob()

    def _ensure_blob(self) -> None:
        try:
            self.blob.upload_blob(b"", overwrite=False)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code != 412:  # 412: leased, so it exists
                raise translate(exc, f"creating lease blob {self.blob.blob_name}") from exc
        except AzureError as exc:
            raise translate(exc, f"creating lease blob {self.blob.blob_name}") from exc

    def try_acquire(self) -> bool:
        """Take the lease if it is free and start renewing it; False when another holder has it."""
        if self.held:
            return True
        if self._client is not None:  # lost earlier: clean up before trying again
            self.abandon()
        started = self._monotonic()
        from azure.storage.blob import BlobLeaseClient

        client = BlobLeaseClient(self.blob, lease_id=self._lease_id)
        try:
            try:
                client.acquire(lease_duration=self.duration)
            except ResourceNotFoundError:  # first use of this shard: create its blob, then try once more
                self.setup_infrastructure()
                started = self._monotonic()
                client.acquire(lease_duration=self.duration)
        except HttpResponseError as exc:
            if exc.status_code == 409:
                return False
            raise translate(exc, f"acquiring lease on {self.blob.blob_name}") from exc
        except AzureError as exc:
            raise translate(exc, f"acquiring lease on {self.blob.blob_name}") from exc
        self._client = client
        self._valid_until = started + self.duration - self.margin
        self._lost.clear()
        self._stop = threading.Event()  # one per acquisition: a slow old renewer can never be revived
        self._thread = threading.Thread(
            target=self._renew_loop, args=(self._stop,), name=f"lease-{self.shard}", daemon=True
        )
        self._thread.start()
        _log.info("lease acquired", extra={lf.EVENT: EVENT_LEASE_ACQUIRED, lf.SHARD: self.shard})
        return True

    def keep_going(self) -> bool:
        """True while it is safe to keep dispatching this shard."""
        return self.held and self._monotonic() < self._valid_until

    def renew(self) -> bool:
        """Renew once now; on failure mark the lease lost and return False."""
        client = self._client
        if client is None or self._lost.is_set():
            return False
        started = self._monotonic()
        try:
            client.renew()
        except AzureError as exc:
            if client is self._client:  # not released or replaced while the call was in flight
                where = f"{self.container.container_name}/{self.blob.blob_name}"
                self._mark_lost(f"renewing lease {client.id} on {where}: {exc!r}")
            return False
        if client is self._client:
            self._valid_until = started + self.duration - self.margin
            self.renewals += 1
        return True

    def _renew_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.renew_every):
            if stop.is_set() or not self.renew():
                return

    def _mark_lost(self, reason: str) -> None:
        if not self._lost.is_set():
            self._lost.set()
            _log.warning(
                "lease lost; dispatching of this shard stops",
                extra={lf.EVENT: EVENT_LEASE_LOST, lf.SHARD: self.shard, lf.REASON: reason},
            )

    def abandon(self) -> None:
        """Stop renewing without releasing (what a crashed holder looks like to the others)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self._client = None

    def release(self) -> None:
        """Stop renewing and give the lease back so the next dispatcher can start at once."""
        client = self._client
        self.abandon()
        if client is not None and not self._lost.is_set():
            try:
                client.release()
                _log.info("lease released", extra={lf.EVENT: EVENT_LEASE_RELEASED, lf.SHARD: self.shard})
            except AzureError as exc:
                _log.warning(
                    "could not release lease; it expires on its own",
                    extra={lf.SHARD: self.shard, lf.REASON: repr(exc)},
                )
        self._lost.clear()
