"""The entry points' pattern: the handler is built from the environment on the first call, once, then reused."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from delayed_delivery.aws.lambda_entry import BuiltOnFirstCall


def _counting_builder(builds: list[str]) -> Callable[[Mapping[str, str]], Callable[[Any, Any], dict[str, Any]]]:
    def build(env: Mapping[str, str]) -> Callable[[Any, Any], dict[str, Any]]:
        builds.append(env.get("ENTRY_PROBE", ""))
        number = len(builds)
        return lambda event, context: {"event": event, "build": number}

    return build


def test_built_on_the_first_call_from_the_environment_then_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    handler = BuiltOnFirstCall(_counting_builder(builds))
    monkeypatch.setenv("ENTRY_PROBE", "first")
    assert not handler.built and builds == []
    assert handler(1, None) == {"event": 1, "build": 1}
    monkeypatch.setenv("ENTRY_PROBE", "second")
    assert handler(2, None) == {"event": 2, "build": 1} and builds == ["first"] and handler.built
    handler.reset()
    assert not handler.built
    assert handler(3, None) == {"event": 3, "build": 2} and builds == ["first", "second"]


def test_concurrent_first_calls_build_once() -> None:
    builds: list[str] = []
    gate = threading.Barrier(8)
    handler = BuiltOnFirstCall(_counting_builder(builds))
    answers: list[dict[str, Any]] = []

    def call(n: int) -> None:
        gate.wait()
        answers.append(handler(n, None))

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and sorted(a["event"] for a in answers) == list(range(8))


def test_a_failed_build_is_tried_again_on_the_next_call() -> None:
    attempts: list[int] = []

    def build(env: Mapping[str, str]) -> Callable[[Any, Any], dict[str, Any]]:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("the environment is wrong")
        return lambda event, context: {"ok": True}

    handler = BuiltOnFirstCall(build)
    with pytest.raises(RuntimeError, match="environment is wrong"):
        handler({}, None)
    assert not handler.built
    assert handler({}, None) == {"ok": True} and len(attempts) == 2
