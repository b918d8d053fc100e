"""``aws verify`` on moto server: compressed probe timings and a deployment as ``aws create --buckets`` makes it, on
the session's plain-HTTP moto, and on a second moto over HTTPS (a self-signed certificate) where the tier's TLS-only
bucket policy can be set and checked as in the cloud. (moto denies every object request under that policy, since it
cannot evaluate its condition, so the probes through the tier run on the plain-HTTP one.)"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from delayed_delivery.app.cli import app
from tests.fixtures.moto import REGION, _moto_executable
from tests.fixtures.services import ServiceProcess, free_port

#: Compressed time: 2 s native cap and hop, 1 s fine buckets, probes due in 1-5 s, short grace and watches.
FAST = {
    "DELAYED_DELIVERY_MAX_NATIVE_DELAY": "2",
    "DELAYED_DELIVERY_FIFO_QUEUE_DELAY": "2",
    "DELAYED_DELIVERY_BUCKET_FINE_SECONDS": "1",
    "DELAYED_DELIVERY_BUCKET_COARSE_SECONDS": "2",
    "DELAYED_DELIVERY_BUCKET_DISPATCH_LEAD_SECONDS": "2",
    "DELAYED_DELIVERY_CANCELLATION_CACHE_SECONDS": "0",
    "DELAYED_DELIVERY_BUCKET_NAME": "verify-tier",
    "DELAYED_DELIVERY_VERIFY_NATIVE_DELAY": "1",
    "DELAYED_DELIVERY_VERIFY_FIFO_DELAY": "3",
    "DELAYED_DELIVERY_VERIFY_TIER_DELAY": "3",
    "DELAYED_DELIVERY_VERIFY_CANCEL_DELAY": "5",
    "DELAYED_DELIVERY_VERIFY_RESCHEDULE_SHIFT": "1",
    "DELAYED_DELIVERY_VERIFY_GRACE": "6",
    "DELAYED_DELIVERY_VERIFY_DUPLICATE_WATCH": "1",
    "DELAYED_DELIVERY_VERIFY_POLL": "1",
    "DELAYED_DELIVERY_VERIFY_PROGRESS_EVERY": "2",
    "DELAYED_DELIVERY_VERIFY_METRICS_WAIT": "0",
}


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "moto.pem", folder / "moto.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="session")
def moto_tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """moto server over HTTPS on a free port: its URL and the certificate to trust."""
    cert, key = _certificate(tmp_path_factory.mktemp("tls"))
    port = free_port()
    argv = [_moto_executable(), "-H", "127.0.0.1", "-p", str(port), "-c", str(cert), "-k", str(key)]
    service = ServiceProcess("moto-tls", argv, [port])
    service.start()
    try:
        yield f"https://127.0.0.1:{port}", cert
    finally:
        service.stop()


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compressed settings in the environment, and no endpoint variables from outside."""
    for name in (
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "DELAYED_DELIVERY_LONG_DELAY_ROUTE",
        "DELAYED_DELIVERY_ERROR_QUEUE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in FAST.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def moto_tls(moto_tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, fast: None) -> str:
    """The HTTPS moto, reset, trusted by boto3 (AWS_CA_BUNDLE)."""
    url, cert = moto_tls_server
    import ssl

    context = ssl.create_default_context(cafile=str(cert))
    request = urllib.request.Request(f"{url}/moto-api/reset", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        assert reply.status == 200
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert))
    return url


def client(service: str, endpoint: str) -> Any:
    """A boto3 client on the emulator at ``endpoint``."""
    import boto3

    return boto3.client(
        service, endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )


runner = CliRunner()  # stdout and stderr apart (click 8.2+)


def cli(*args: str) -> tuple[int, str, str]:
    """``delayed-delivery <args>``: exit code, stdout, stderr."""
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _create(endpoint: str) -> str:
    code, out, err = cli("aws", "create", "--queue", "orders", "--buckets", "--endpoint-url", endpoint)
    assert code == 0, out + err
    return endpoint


@pytest.fixture
def deployed(moto_endpoint: str, fast: None) -> str:
    """A healthy deployment on the plain-HTTP moto: endpoint ``orders`` and the tier, as ``aws create --buckets``."""
    return _create(moto_endpoint)


@pytest.fixture
def deployed_tls(moto_tls: str) -> str:
    """The same on the HTTPS moto, where the bucket gets its TLS-only policy."""
    return _create(moto_tls)


def verify(endpoint: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """``aws verify --endpoint-url <endpoint> --json <extra>``: exit code, the JSON document, stderr."""
    code, out, err = cli("aws", "verify", "--endpoint-url", endpoint, "--buckets", "--json", *extra)
    try:
        document = json.loads(out)
    except ValueError:
        raise AssertionError(f"stdout is not one JSON document (exit {code}):\n{out}\n{err}") from None
    return code, document, err


def by_check(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The checks keyed by (check, subject)."""
    return {(c["check"], c["subject"]): c for c in document["checks"]}


@pytest.fixture
def verify_calls() -> Iterator[list[Any]]:
    """Every request verify's own code makes from now on (boto3's default session, which its clients come from)."""
    import boto3

    from tests.aws.verify.policy import recorder

    calls: list[Any] = []
    boto3.setup_default_session()
    hook = recorder(calls)
    assert boto3.DEFAULT_SESSION is not None
    boto3.DEFAULT_SESSION.events.register("before-parameter-build", hook)
    yield calls
    boto3.DEFAULT_SESSION.events.unregister("before-parameter-build", hook)
