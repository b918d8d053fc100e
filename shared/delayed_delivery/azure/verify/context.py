"""What every ``azure verify`` check receives: the target (the delays account and names), the clients, the settings,
the clock, progress, clean-up, the dispatcher port and the role and alert listings when given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...clock import Clock
from ...verification import PROBE_QUEUE, Cleanup, Mode, Progress, VerifySettings
from ..config import AzureClients, AzureDelayedDeliveryConfig

__all__ = ["PROBE_QUEUE", "AzureTarget", "AzureVerifyContext", "Dispatcher"]


class Dispatcher(Protocol):
    """The dispatcher while probes are in flight: the function app's timer in Azure, run here on an emulator."""

    @property
    def local(self) -> bool:
        """True when this process runs it."""
        ...

    def run_for(self, seconds: float) -> None:
        """Let it dispatch for up to ``seconds``."""
        ...


@dataclass(frozen=True, slots=True)
class AzureTarget:
    """The deployment: its configuration (account, table, container, shards, destinations) and the probe queue."""

    config: AzureDelayedDeliveryConfig
    description: str
    local: bool
    probe_queue: str = PROBE_QUEUE
    #: Role assignments of the dispatcher's identity (``az role assignment list --assignee <id> --all``), if given.
    role_assignments: Sequence[Mapping[str, Any]] | None = None
    #: Scheduled query rules of the resource group (``az monitor scheduled-query list -g <rg>``), if given.
    alert_rules: Sequence[Mapping[str, Any]] | None = None
    #: The schedules table (recurring schedules) and whether they must be on (``DELAYED_DELIVERY_SCHEDULES``); when
    #: not, a missing table means schedules are off and its checks are skipped.
    schedules_table: str | None = None
    schedules_on: bool = False
    #: The options that name this deployment to the other ``delayed-delivery azure`` commands (for the fixes).
    cli_options: str = "--endpoint <endpoint>"

    def command(self, verb: str) -> str:
        """``delayed-delivery azure <verb>`` on this deployment, e.g. ``azure setup --local --endpoint orders``."""
        return f"delayed-delivery azure {verb} {self.cli_options}"


@dataclass(slots=True)
class AzureVerifyContext:
    """One run of ``azure verify``."""

    target: AzureTarget
    clients: AzureClients
    settings: VerifySettings
    clock: Clock
    progress: Progress
    cleanup: Cleanup
    dispatcher: Dispatcher
    mode: Mode = Mode.QUICK
    run_id: str = "run"
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def account(self) -> str:
        """The delays storage account's name."""
        return str(self.clients.queues.account_name)

    @property
    def missing(self) -> set[str]:
        """What the configuration checks found missing (``table``, ``container``, ``lease blobs``, ``error queue``)."""
        found: set[str] = self.notes.setdefault("missing", set())
        return found
