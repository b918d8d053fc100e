"""``redact``: URL passwords, libpq ``password=`` and Azure keys and signatures are masked; the rest is kept."""

from __future__ import annotations

import pytest

from delayed_delivery.redact import redact


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://user:sekrit@db.example:5432/app", "postgresql://user:***@db.example:5432/app"),
        ("postgresql://user:p@ss@host/db", "postgresql://user:***@host/db"),
        ("unknown store URL 'mysql://u:pw@h/db': use …", "unknown store URL 'mysql://u:***@h/db': use …"),
        ("host=h password=secret user=u", "host=h password=*** user=u"),
        ("host=h password='a b' user=u", "host=h password=*** user=u"),
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc+/==;EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net",
        ),
        (
            "BlobEndpoint=https://a.blob.core.windows.net;SharedAccessSignature=sv=2020&ss=b&sig=XY%3D;QueueEndpoint=q",
            "BlobEndpoint=https://a.blob.core.windows.net;SharedAccessSignature=***;QueueEndpoint=q",
        ),
        ("https://a.blob.core.windows.net/c?sv=1&sig=abc&se=2", "https://a.blob.core.windows.net/c?sv=1&sig=***&se=2"),
    ],
)
def test_secrets_are_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    ["postgresql://db.example/app", "postgresql://user@db/app", "http://127.0.0.1:5000/q@x", "sqlite:////tmp/a.db"],
)
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text
