"""Azure configuration from app settings, and the SDK clients it implies.

App settings (all optional unless noted):

| variable | default | meaning |
|---|---|---|
| ``DELAYED_DELIVERY_ENDPOINT`` | required unless the table name is given | endpoint whose delays table this is |
| ``DELAYED_DELIVERY_TABLE_NAME`` / ``..._CONTAINER_NAME`` | ``delays`` + SHA-1(endpoint) | overrides |
| ``DELAYED_DELIVERY_STORAGE_CONNECTION_STRING`` | none | connection string (local / Azurite) |
| ``DELAYED_DELIVERY_STORAGE_ACCOUNT`` | none | account name for identity-based access (managed identity) |
| ``AZURE_CLIENT_ID`` | none | client id of a user-assigned managed identity |
| ``DELAYED_DELIVERY_SHARDS`` | the table's | partitions / leases: recorded in the table at setup; set, it must match |
| ``DELAYED_DELIVERY_LEASE_SECONDS`` | ``30`` | blob lease duration, 15–60 |
| ``DELAYED_DELIVERY_RUN_SECONDS`` | ``50`` | how long one timer run dispatches |
| ``DELAYED_DELIVERY_CLAIM_TIMEOUT`` | ``60`` | seconds a claimed row stays invisible to other dispatchers |
| ``DELAYED_DELIVERY_QUEUE_CONNECT_TIMEOUT`` | ``3`` | seconds a queue request may take to connect |
| ``DELAYED_DELIVERY_QUEUE_READ_TIMEOUT`` | ``5`` | seconds a queue request waits for its answer (also the service's) |
| ``DELAYED_DELIVERY_SEND_TIMEOUT`` | ``10`` | seconds one put may take, its retries included (below) |
| ``DELAYED_DELIVERY_ALLOWED_DESTINATIONS`` | any queue of the account | comma-separated queue names / patterns |
| ``DELAYED_DELIVERY_PLACE_AHEAD`` | ``0`` (off) | seconds ahead of due that rows go on their queues, hidden |

``SEND_TIMEOUT`` is at least connect + read (one attempt fits) and below the claim timeout less 2 s: a put starts only
while that much of its claim is left, and a retry only while a whole attempt still fits.

plus every core setting (``DelayedDeliverySettings.from_env``). When neither storage variable is set,
``AzureWebJobsStorage`` (a connection string) or ``AzureWebJobsStorage__accountName`` is used.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..envsettings import env_name, env_value
from ..errors import ConfigurationError
from ..naming import azure_delays_table_name, validate_azure_container_name, validate_azure_table_name
from ..redact import redact
from ..settings import DelayedDeliverySettings
from ..validation import is_number, is_whole
from .blob_lease import MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from .destinations import DestinationPolicy, parse_patterns
from .run_budget import RunBudget, SendBound

if TYPE_CHECKING:  # the SDKs load when clients are made, so reading settings (and the CLI's start) stays light
    from azure.core.pipeline.transport import RequestsTransport
    from azure.data.tables import TableServiceClient
    from azure.storage.blob import BlobServiceClient
    from azure.storage.queue import QueueServiceClient

__all__ = ["AzureClients", "AzureDelayedDeliveryConfig", "http_transport"]

ENV_ENDPOINT = "DELAYED_DELIVERY_ENDPOINT"
ENV_TABLE = "DELAYED_DELIVERY_TABLE_NAME"
ENV_CONTAINER = "DELAYED_DELIVERY_CONTAINER_NAME"
ENV_CONNECTION = "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING"
ENV_ACCOUNT = "DELAYED_DELIVERY_STORAGE_ACCOUNT"
ENV_CLIENT_ID = "AZURE_CLIENT_ID"
ENV_SHARDS = "DELAYED_DELIVERY_SHARDS"
ENV_LEASE = "DELAYED_DELIVERY_LEASE_SECONDS"
ENV_RUN = "DELAYED_DELIVERY_RUN_SECONDS"
ENV_CLAIM = "DELAYED_DELIVERY_CLAIM_TIMEOUT"
ENV_ALLOWED = "DELAYED_DELIVERY_ALLOWED_DESTINATIONS"
ENV_PLACE_AHEAD = "DELAYED_DELIVERY_PLACE_AHEAD"
ENV_QUEUE_CONNECT = "DELAYED_DELIVERY_QUEUE_CONNECT_TIMEOUT"
ENV_QUEUE_READ = "DELAYED_DELIVERY_QUEUE_READ_TIMEOUT"
ENV_SEND_TIMEOUT = "DELAYED_DELIVERY_SEND_TIMEOUT"
#: Seconds of claim kept beyond a put's bound (``outcomes.CLAIM_MARGIN``; the core is not imported for one number).
_CLAIM_MARGIN = 2.0
#: The longest lead: a queue hides a message for at most 7 days (a minute kept for clock differences).
MAX_PLACE_AHEAD = 7 * 24 * 3600 - 60
ENV_HOST_STORAGE = "AzureWebJobsStorage"
#: A lease renewal that stalls must fail (and be retried) well within the lease duration.
_LEASE_TIMEOUTS = {"connection_timeout": 5.0, "read_timeout": 10.0}
#: Commands people run: a storage endpoint that is down or silent fails within seconds (with one retry).
_FAIL_FAST_TIMEOUTS = {"connection_timeout": 2.0, "read_timeout": 2.0}
_UNUSABLE_CONNECTION = (
    "the storage connection string is not usable (it needs AccountName with AccountKey or SharedAccessSignature, "
    "and DefaultEndpointsProtocol or the service endpoints; Azurite: UseDevelopmentStorage=true)"
)
#: Most pooled connections per service (a bound on sockets, whatever the shard count).
_MAX_POOL = 512
#: Parallel queue puts when ``DELAYED_DELIVERY_MAX_CONCURRENCY`` is not set (Put Message has no batch form).
DEFAULT_AZURE_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class AzureDelayedDeliveryConfig:
    """Where the delays live and how the dispatcher runs."""

    table_name: str
    container_name: str
    connection_string: str | None = field(default=None, repr=False)
    account_name: str | None = None
    managed_identity_client_id: str | None = None
    #: The shard count to use on a table that records none (``layout.resolve_shards``: a table's own count wins).
    shards: int = 1
    #: Whether ``shards`` was set on purpose (``DELAYED_DELIVERY_SHARDS``): a table recording another count is then
    #: refused at start-up instead of followed.
    shards_configured: bool = False
    lease_seconds: int = 30
    run_seconds: float = 50.0
    claim_timeout: float = 60.0
    settings: DelayedDeliverySettings = field(default_factory=DelayedDeliverySettings)
    #: Queue names or ``*``/``?`` patterns the dispatcher may send to; empty = any queue of its account.
    allowed_destinations: tuple[str, ...] = ()
    #: Seconds before their due time rows are put on their queues, hidden until due (0: at the due time only).
    place_ahead: float = 0.0
    #: A queue request's connection and read timeouts, and the longest one put takes with its retries (seconds).
    queue_connect_timeout: float = 3.0
    queue_read_timeout: float = 5.0
    send_timeout: float = 10.0

    def __post_init__(self) -> None:
        validate_azure_table_name(self.table_name)
        validate_azure_container_name(self.container_name)
        if not self.connection_string and not self.account_name:
            raise ConfigurationError(
                f"no storage account: set {ENV_CONNECTION} (connection string) or {ENV_ACCOUNT} (managed identity)"
            )
        if not is_whole(self.shards, 1, 1000):
            raise ConfigurationError(f"{ENV_SHARDS} must be from 1 to 1000, got {self.shards!r}")
        if not is_whole(self.lease_seconds, MIN_LEASE_SECONDS, MAX_LEASE_SECONDS):
            raise ConfigurationError(
                f"{ENV_LEASE} must be from {MIN_LEASE_SECONDS} to {MAX_LEASE_SECONDS}, got {self.lease_seconds!r}"
            )
        if not (is_number(self.run_seconds) and 0 < self.run_seconds < math.inf):
            raise ConfigurationError(f"{ENV_RUN} must be a positive number of seconds, got {self.run_seconds!r}")
        if not (is_number(self.claim_timeout) and 0 < self.claim_timeout < math.inf):
            raise ConfigurationError(f"{ENV_CLAIM} must be a positive number of seconds, got {self.claim_timeout!r}")
        if not (is_number(self.place_ahead) and 0 <= self.place_ahead <= MAX_PLACE_AHEAD):
            raise ConfigurationError(
                f"{ENV_PLACE_AHEAD} must be from 0 to {MAX_PLACE_AHEAD} seconds (a queue hides a message for at most "
                f"7 days), got {self.place_ahead!r}"
            )
        self._check_send_bound()
        object.__setattr__(
            self, "allowed_destinations", parse_patterns(",".join(self.allowed_destinations), ENV_ALLOWED)
        )

    def _check_send_bound(self) -> None:
        """Positive timeouts; a send long enough for one attempt, and short enough that a claim can outlast it."""
        for name, value in (
            (ENV_QUEUE_CONNECT, self.queue_connect_timeout),
            (ENV_QUEUE_READ, self.queue_read_timeout),
            (ENV_SEND_TIMEOUT, self.send_timeout),
        ):
            if not (is_number(value) and 0 < value < math.inf):
                raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.send_timeout < self.send_bound.attempt:
            raise ConfigurationError(
                f"{ENV_SEND_TIMEOUT} ({self.send_timeout:g} s) must be at least {ENV_QUEUE_CONNECT} + {ENV_QUEUE_READ} "
                f"({self.send_bound.attempt:g} s): one attempt must fit"
            )
        if self.claim_timeout <= self.send_timeout + _CLAIM_MARGIN:
            raise ConfigurationError(
                f"{ENV_CLAIM} ({self.claim_timeout:g} s) must exceed {ENV_SEND_TIMEOUT} ({self.send_timeout:g} s) by "
                f"more than {_CLAIM_MARGIN:g} s: a put starts only while its claim outlasts it"
            )

    @property
    def send_bound(self) -> SendBound:
        """How long a queue put may take (its attempts' timeouts, and the whole put with its retries)."""
        return SendBound(self.send_timeout, self.queue_connect_timeout, self.queue_read_timeout)

    def with_shards(self, shards: int) -> AzureDelayedDeliveryConfig:
        """This configuration with the table's shard count."""
        return replace(self, shards=shards)

    @property
    def destination_policy(self) -> DestinationPolicy:
        """The queues the dispatcher may send to (the error queue always among them)."""
        return DestinationPolicy(self.settings.error_queue, self.allowed_destinations)

    @classmethod
    def for_endpoint(
        cls,
        endpoint: str,
        *,
        table_name: str | None = None,
        container_name: str | None = None,
        **kwargs: Any,
    ) -> AzureDelayedDeliveryConfig:
        """Config with the NServiceBus default names for ``endpoint`` (``delays`` + SHA-1), overridable."""
        default = azure_delays_table_name(endpoint)
        return cls(table_name=table_name or default, container_name=container_name or default, **kwargs)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AzureDelayedDeliveryConfig:
        """Build from app settings (see the module docstring); ``ConfigurationError`` names the bad variable."""
        table, container = env_value(env, ENV_TABLE, str, ""), env_value(env, ENV_CONTAINER, str, "")
        endpoint = env_value(env, ENV_ENDPOINT, str, "")
        if not endpoint and not (table and container):
            raise ConfigurationError(f"set {ENV_ENDPOINT} (or both {ENV_TABLE} and {ENV_CONTAINER})")
        default = azure_delays_table_name(endpoint) if endpoint else ""
        connection = env_value(env, ENV_CONNECTION, str, "") or None
        account = env_value(env, ENV_ACCOUNT, str, "") or None
        if connection is None and account is None:
            connection = env_value(env, ENV_HOST_STORAGE, str, "") or None
            account = env_value(env, ENV_HOST_STORAGE + "__accountName", str, "") or None
        settings = DelayedDeliverySettings.from_env(env)
        if not env_value(env, env_name("max_concurrency"), str, ""):
            settings = settings.with_(max_concurrency=DEFAULT_AZURE_CONCURRENCY)
        return cls(
            table_name=table or default,
            container_name=container or default,
            connection_string=connection,
            account_name=account,
            managed_identity_client_id=env_value(env, ENV_CLIENT_ID, str, "") or None,
            shards=env_value(env, ENV_SHARDS, int, 1),
            shards_configured=bool(env_value(env, ENV_SHARDS, str, "").strip()),
            lease_seconds=env_value(env, ENV_LEASE, int, 30),
            run_seconds=env_value(env, ENV_RUN, float, 50.0),
            claim_timeout=env_value(env, ENV_CLAIM, float, 60.0),
            settings=settings,
            allowed_destinations=parse_patterns(env.get(ENV_ALLOWED, ""), ENV_ALLOWED),
            place_ahead=env_value(env, ENV_PLACE_AHEAD, float, 0.0),
            queue_connect_timeout=env_value(env, ENV_QUEUE_CONNECT, float, 3.0),
            queue_read_timeout=env_value(env, ENV_QUEUE_READ, float, 5.0),
            send_timeout=env_value(env, ENV_SEND_TIMEOUT, float, 10.0),
        )


@dataclass(frozen=True, slots=True)
class AzureClients:
    """The three service clients for one storage account."""

    tables: TableServiceClient
    blobs: BlobServiceClient
    queues: QueueServiceClient
    #: The run the queue client's retry back-offs are capped by (``AzureDispatcherHost.run`` sets it).
    budget: RunBudget = field(default_factory=RunBudget)

    @classmethod
    def create(cls, config: AzureDelayedDeliveryConfig, *, fail_fast: bool = False) -> AzureClients:
        """Clients from a connection string, or from a managed identity when only the account is known.

        ``fail_fast`` (commands run by people): short timeouts and no retry, so a storage endpoint that is down
        or silent fails within seconds instead of retrying for minutes.
        """
        from azure.data.tables import TableServiceClient
        from azure.storage.blob import BlobServiceClient
        from azure.storage.queue import QueueServiceClient

        budget = RunBudget()
        table, blob, queue = _client_options(config, budget, fail_fast)
        services: list[tuple[Any, str, dict[str, Any]]] = [
            (TableServiceClient, "table", table),
            (BlobServiceClient, "blob", blob),
            (QueueServiceClient, "queue", queue),
        ]
        if config.connection_string:
            try:
                made = [kind.from_connection_string(config.connection_string, **kw) for kind, _, kw in services]
            except ValueError as exc:  # the SDK's parser: malformed, or missing the account, key or endpoints
                raise ConfigurationError(f"{_UNUSABLE_CONNECTION}: {redact(str(exc))}") from None
        else:
            from azure.identity import DefaultAzureCredential  # only needed in Azure

            credential = DefaultAzureCredential(managed_identity_client_id=config.managed_identity_client_id)
            account = config.account_name
            made = [
                kind(f"https://{account}.{name}.core.windows.net", credential=credential, **kw)
                for kind, name, kw in services
            ]
        tables, blobs, queues = made
        return cls(tables, blobs, queues, budget)


def _client_options(
    config: AzureDelayedDeliveryConfig, budget: RunBudget, fail_fast: bool
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The table, blob and queue clients' keyword arguments: HTTP transports with their timeouts, retry policies."""
    from .storage_queue import BudgetedRetry

    pool = _pool_size(config)  # parallel puts must not queue for connections
    lease_timeouts, timeouts = (_FAIL_FAST_TIMEOUTS, _FAIL_FAST_TIMEOUTS) if fail_fast else (_LEASE_TIMEOUTS, {})
    # every queue request ends within its timeouts (the SDK's default is 300 s each)
    bound = config.send_bound
    queue_timeouts = timeouts or {"connection_timeout": bound.connect_timeout, "read_timeout": bound.read_timeout}
    options: dict[str, Any] = {"retry_total": 0} if fail_fast else {}
    # Storage queues and blobs wait 15 s before their first retry by default (tables 0.8 s).
    storage = {**options, "initial_backoff": 1, "increment_base": 1} if fail_fast else {}
    # a host's puts: the SDK's back-offs, capped by the time left in the run and in the put
    queue_options = storage if fail_fast else {"retry_policy": BudgetedRetry(budget)}
    return (
        {"transport": http_transport(pool, **timeouts), **options},
        {"transport": http_transport(10, **lease_timeouts), **storage},
        {"transport": http_transport(pool, **queue_timeouts), **queue_options},
    )


def _pool_size(config: AzureDelayedDeliveryConfig) -> int:
    """Connections to keep per service: every shard's puts run in parallel (and its placer's, with a lead)."""
    per_shard = config.settings.max_concurrency * (2 if config.place_ahead > 0 else 1)
    return max(10, min(_MAX_POOL, per_shard * config.shards + 4))


@functools.cache
def _env_once_session() -> Any:
    """The class ``EnvOnceSession``, built when first needed (requests loads with the SDK, not at import)."""
    import requests

    class EnvOnceSession(requests.Session):
        """A session that reads the environment's proxy and CA settings once per host, not on every request.

        requests looks them up (and ~/.netrc, and the proxy variables through ``urllib``) for each request: about a
        tenth of a put's CPU. Here the first request to a host does it; later changes to the environment are not
        seen. ``.netrc`` is never read (storage requests carry their own ``Authorization``).
        """

        def __init__(self) -> None:
            super().__init__()
            self.trust_env = False
            self._probe = requests.Session()
            self._merged: dict[tuple[Any, ...], dict[str, Any]] = {}

        def merge_environment_settings(
            self, url: str, proxies: Any, stream: Any, verify: Any, cert: Any
        ) -> dict[str, Any]:
            host = url.split("/", 3)[2] if "//" in url else url
            key = (host, stream, verify, cert, tuple(sorted((proxies or {}).items())))
            merged = self._merged.get(key)
            if merged is None:
                merged = self._merged[key] = self._probe.merge_environment_settings(url, proxies, stream, verify, cert)
            return dict(merged, proxies=dict(merged["proxies"]))

    return EnvOnceSession


def http_transport(pool: int, **timeouts: float) -> RequestsTransport:
    """An HTTP transport keeping ``pool`` connections per host alive.

    With fewer pooled connections than parallel calls, every extra call opens and drops a connection; on a
    busy endpoint the churn overflows its accept queue and a dropped SYN stalls a call for seconds.
    """
    import requests
    from azure.core.pipeline.transport import RequestsTransport

    session = _env_once_session()()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=pool)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return RequestsTransport(session=session, session_owner=True, **timeouts)
