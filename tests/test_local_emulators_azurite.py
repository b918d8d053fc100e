"""Where ``local up`` and the demo find Azurite: configured, a checkout, PATH, the user cache, or installed there
with npm (with a clear line when npm is missing)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from delayed_delivery.app import emulators
from delayed_delivery.app.emulators import AZURITE_VERSION, LocalEmulators, azurite_cache
from delayed_delivery.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
REAL_AZURITE = ROOT / "node_modules" / "azurite" / "dist" / "src" / "azurite.js"


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Azurite anywhere: no setting, no checkout, an empty working folder, an empty cache; PATH has node only."""
    monkeypatch.delenv("DELAYED_DELIVERY_AZURITE", raising=False)
    monkeypatch.setattr(emulators, "_CHECKOUT", tmp_path / "no-checkout")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    node = next(Path(d) / "node" for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / "node").exists())
    (bin_dir / "node").symlink_to(node)
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def test_a_configured_path_that_does_not_exist_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYED_DELIVERY_AZURITE", "/nonexistent/azurite.js")
    with pytest.raises(ConfigurationError, match=r"DELAYED_DELIVERY_AZURITE='/nonexistent/azurite.js' does not exist"):
        LocalEmulators(moto=False)


def test_without_azurite_and_without_npm_the_error_says_what_to_install(nowhere: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        LocalEmulators(moto=False)
    message = str(caught.value)
    assert "npm is missing" in message and "Node.js" in message and "DELAYED_DELIVERY_AZURITE" in message
    assert "\n" not in message


def test_without_azurite_npm_installs_it_into_the_user_cache_once(nowhere: Path, tmp_path: Path) -> None:
    calls = tmp_path / "npm-calls"
    npm = nowhere / "npm"  # stands in for npm: records its arguments, lays out the package as npm would
    npm.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{calls}"\n'
        'while [ "$1" != "--prefix" ]; do shift; done; prefix="$2"\n'
        '/bin/mkdir -p "$prefix/node_modules/azurite/dist/src"\n'
        f'/bin/ln -s "{REAL_AZURITE}" "$prefix/node_modules/azurite/dist/src/azurite.js"\n'
    )
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    said: list[str] = []

    first = LocalEmulators(moto=False, status=said.append).emulators["azurite"].argv
    again = LocalEmulators(moto=False, status=said.append).emulators["azurite"].argv

    cache = azurite_cache()
    assert cache == tmp_path / "cache" / "delayed-delivery" / f"azurite-{AZURITE_VERSION}"
    assert first[1] == again[1] == str(cache / "node_modules" / "azurite" / "dist" / "src" / "azurite.js")
    assert len(calls.read_text().splitlines()) == 1, "installed once, then found in the cache"
    assert f"azurite@{AZURITE_VERSION}" in calls.read_text()
    assert len(said) == 1 and "installing" in said[0] and str(cache) in said[0]
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(".")], "no staging folder left behind"


def test_a_failed_npm_install_is_one_line_and_leaves_no_cache(nowhere: Path) -> None:
    npm = nowhere / "npm"
    npm.write_text("#!/bin/sh\necho 'npm ERR! network unreachable' >&2\nexit 1\n")
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(ConfigurationError, match=r"npm could not install azurite@.*network unreachable"):
        LocalEmulators(moto=False, status=lambda _: None)
    assert not azurite_cache().exists()


def test_the_cached_version_is_the_one_package_json_pins() -> None:
    import json

    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["azurite"]
    assert pinned == AZURITE_VERSION
