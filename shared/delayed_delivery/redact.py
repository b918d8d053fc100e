"""Mask secrets in text shown to people: URL passwords and Azure connection-string keys and signatures."""

from __future__ import annotations

import re

__all__ = ["MASK", "redact"]

#: What a secret is replaced by.
MASK = "***"

#: ``scheme://user:password@host``: the password part (up to the last ``@`` before the host).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)[^\s/'\"]*(?P<at>@)")
#: libpq keyword form: ``password=secret`` (quoted or not).
_KEYWORD_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'|[^\s;'\"]+)", re.IGNORECASE)
#: Azure connection strings and SAS URLs: ``AccountKey=…``, ``SharedAccessSignature=…``, ``sig=…``.
_AZURE_SECRET = re.compile(
    r"(?P<head>\b(?:AccountKey|SharedAccessSignature|SharedAccessKey|sig)=)[^;&\s'\"]+", re.IGNORECASE
)
#: A SAS token after ``SharedAccessSignature=`` spans several ``&``-joined fields: mask them all.
_SAS_FIELDS = re.compile(r"(?P<head>\bSharedAccessSignature=)[^;\s'\"]+", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with URL passwords, ``password=`` values and Azure keys and signatures replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}{m['at']}", text)
    text = _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)
    text = _SAS_FIELDS.sub(lambda m: f"{m['head']}{MASK}", text)
    return _AZURE_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
