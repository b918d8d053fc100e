"""``delayed-delivery local up``: run moto server and Azurite on the fixed ports that ``--local`` points at."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Annotated, Any

import typer

from delayed_delivery.app.cli.output import emit_json, fail, say
from delayed_delivery.app.emulators import LocalEmulators, azurite_connection_string
from delayed_delivery.app.routes import LOCAL_AZURITE_PORTS, LOCAL_MOTO_PORT, LOCAL_REGION
from delayed_delivery.errors import DelayedDeliveryError

__all__ = ["local_app"]


local_app = typer.Typer(
    name="local",
    help="Local emulators on fixed ports (moto server 5000, Azurite 10000-10002) for --local.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@local_app.command()
def up(
    moto_port: Annotated[int, typer.Option(help="moto server port.")] = LOCAL_MOTO_PORT,
    azurite_port: Annotated[int, typer.Option(help="Azurite blob port; queue and table use the next two.")] = (
        LOCAL_AZURITE_PORTS[0]
    ),
    seconds: Annotated[
        float | None, typer.Option("--for", help="Stop after this many seconds (default: until Ctrl-C).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the connection settings as JSON.")] = False,
) -> None:
    """Start moto server and Azurite in memory on loopback and keep them up until Ctrl-C.

    Example: delayed-delivery local up   (then, in another shell: delayed-delivery send --cloud aws --local …)
    """
    ports = (azurite_port, azurite_port + 1, azurite_port + 2)
    previous = _stop_on_signals()  # SIGTERM too: the emulators run in their own sessions and would outlive us
    try:
        _serve(moto_port, ports, seconds, as_json)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@local_app.command()
def env(
    moto_port: Annotated[int, typer.Option(help="moto server port.")] = LOCAL_MOTO_PORT,
    azurite_port: Annotated[int, typer.Option(help="Azurite blob port; queue and table use the next two.")] = (
        LOCAL_AZURITE_PORTS[0]
    ),
) -> None:
    """Print the exports that point the AWS and Azure SDKs at `local up`'s emulators (what `local up` prints).

    Example: eval "$(delayed-delivery local env)"   (then boto3 and the Azure examples use the emulators)
    """
    ports = (azurite_port, azurite_port + 1, azurite_port + 2)
    for key, value in local_settings(f"http://127.0.0.1:{moto_port}", ports).items():
        say(f"export {key}='{value}'")


def _serve(moto_port: int, ports: tuple[int, int, int], seconds: float | None, as_json: bool) -> None:
    """Start both emulators, print how to reach them, wait, and stop them (also on Ctrl-C or SIGTERM)."""
    try:
        emulators = LocalEmulators(moto_port=moto_port, azurite_ports=ports)
        try:
            emulators.start()
            _print_settings(emulators.sqs_endpoint, ports, as_json)
            threading.Event().wait(seconds)
        except KeyboardInterrupt:
            pass
        finally:
            emulators.stop()
    except DelayedDeliveryError as exc:
        raise fail(str(exc)) from None


def local_settings(sqs_endpoint: str, ports: tuple[int, int, int]) -> dict[str, str]:
    """The environment that points the SDKs, the examples and the commands at the emulators."""
    return {
        "AWS_DEFAULT_REGION": LOCAL_REGION,
        "AWS_ACCESS_KEY_ID": "testing",  # moto takes any credentials; these are no secret
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": sqs_endpoint,  # every AWS SDK client: SQS, S3, DynamoDB (moto serves all on one port)
        "AWS_ENDPOINT_URL_SQS": sqs_endpoint,
        "DELAYED_DELIVERY_STORAGE_CONNECTION_STRING": azurite_connection_string(*ports),
    }


def _print_settings(sqs_endpoint: str, ports: tuple[int, int, int], as_json: bool) -> None:
    """Where the emulators listen, as the settings ``--local`` stands for, ready to paste into another shell."""
    settings = local_settings(sqs_endpoint, ports)
    if as_json:
        emit_json(settings)
        return
    say(f"moto server  {sqs_endpoint}  (SQS, S3, DynamoDB)")
    say(f"Azurite      blob {ports[0]}, queue {ports[1]}, table {ports[2]}")
    say("use --local with the commands, or paste these into another shell for the SDKs and the examples:")
    for key, value in settings.items():
        say(f"export {key}='{value}'")
    say("Ctrl-C (or SIGTERM) stops both.")


def _stop_on_signals() -> dict[int, Any]:
    """Make SIGTERM and SIGHUP end ``local up`` as Ctrl-C does (KeyboardInterrupt); returns the handlers replaced."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers (and receives the signals)
    previous: dict[int, Any] = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, interrupt)
    return previous
