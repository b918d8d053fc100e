"""The one packaging rule for deploy assets: an asset holds the modules its entry points import, and nothing else.

The modules are found statically (``ast``, nothing is imported): every import statement of a module counts, at
module level or inside a function, except those under ``if TYPE_CHECKING:``. Importing a module runs its packages'
``__init__`` too, so they come along with their own imports. A package's lazy names (a PEP 562 ``__getattr__``
importing on first use) count only where some module imports a name from the package that is not a submodule,
since only then can they run. Only the packages given are followed; the standard library and the SDKs come from
the runtime. Each package travels with its data files (non-Python files and folders without ``__init__.py``).
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["AssetModules", "copy_asset", "required_modules"]

#: Files of a package folder that are never part of an asset.
_CACHES = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache"})


@dataclass(frozen=True, slots=True)
class _Import:
    """One import statement: ``from module import names`` (``names`` empty for ``import module``)."""

    module: str
    names: tuple[str, ...] = ()
    binds_package: bool = False  # ``import p`` / ``import p.q as x``: attributes of ``p`` / ``p.q`` may be used


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A module's imports: those that run when it is imported or called, and its lazy ``__getattr__`` ones."""

    eager: tuple[_Import, ...]
    lazy: tuple[_Import, ...]


@dataclass(frozen=True, slots=True)
class AssetModules:
    """The modules an asset needs: module name -> source file, with the package folders they come from."""

    modules: Mapping[str, Path]
    packages: Mapping[str, Path] = field(default_factory=dict)

    def relative(self, name: str) -> Path:
        """Where module ``name`` goes inside an asset: ``delayed_delivery/aws/receive.py``."""
        return self.modules[name].relative_to(self.packages[name.partition(".")[0]].parent)

    def lines(self) -> int:
        """Lines of Python the asset holds."""
        return sum(len(path.read_text(encoding="utf-8").splitlines()) for path in self.modules.values())


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement below ``body`` that can run, leaving out ``if TYPE_CHECKING:`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.orelse)
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                yield from _statements([child])
            elif isinstance(child, ast.ExceptHandler | ast.match_case):
                yield from _statements(child.body)


def _imports(statements: Iterable[ast.stmt], package: str | None) -> Iterator[_Import]:
    """The import statements among ``statements``, relative ones resolved against ``package``."""
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield _Import(alias.name, binds_package=alias.asname is not None or "." not in alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if package is None:
                    continue  # a relative import in a script cannot run
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            yield _Import(base, tuple(alias.name for alias in node.names))


def _parse(path: Path, package: str | None) -> _Parsed:
    """The imports of the file at ``path`` (``package``: the package relative imports resolve against)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lazy: list[ast.stmt] = []
    eager: list[ast.stmt] = []
    for node in tree.body:
        if path.name == "__init__.py" and isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            lazy.extend(node.body)
        else:
            eager.append(node)
    return _Parsed(tuple(_imports(_statements(eager), package)), tuple(_imports(_statements(lazy), package)))


class _Finder:
    """Walks the import graph of the given packages from the entry points."""

    def __init__(self, packages: Mapping[str, Path]) -> None:
        self.packages = {name: Path(folder) for name, folder in packages.items()}
        self.found: dict[str, Path] = {}
        self.parsed: dict[str, _Parsed] = {}
        self.lazy_followed: set[str] = set()
        self.todo: list[str] = []

    def locate(self, name: str) -> Path | None:
        """The source file of module ``name`` in the given packages, or None (not ours, or no such module)."""
        top, *rest = name.split(".")
        folder = self.packages.get(top)
        if folder is None:
            return None
        path = folder.joinpath(*rest)
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
        module = path.parent / f"{path.name}.py"
        return module if rest and module.is_file() else None

    def require(self, name: str) -> None:
        """Module ``name`` and its packages are needed (names outside the given packages are ignored)."""
        parts = name.split(".")
        for end in range(1, len(parts) + 1):
            module = ".".join(parts[:end])
            if module in self.found:
                continue
            path = self.locate(module)
            if path is None:
                return
            self.found[module] = path
            self.todo.append(module)

    def follow(self, imports: Iterable[_Import]) -> None:
        """Require what ``imports`` load, and the lazy names of packages they take names from."""
        for record in imports:
            if self.locate(record.module) is None:
                continue
            self.require(record.module)
            if record.binds_package:
                self.follow_lazy(record.module)
            for name in record.names:
                submodule = f"{record.module}.{name}"
                if name != "*" and self.locate(submodule) is not None:
                    self.require(submodule)
                else:
                    self.follow_lazy(record.module)

    def follow_lazy(self, package: str) -> None:
        """A name of ``package`` that is not a submodule may be used: its ``__getattr__`` imports can run."""
        if package in self.lazy_followed:
            return
        self.lazy_followed.add(package)
        self.require(package)
        self.run()
        self.follow(self.parsed[package].lazy)

    def run(self) -> None:
        """Parse every required module not parsed yet, following its imports."""
        while self.todo:
            module = self.todo.pop()
            path = self.found[module]
            parsed = _parse(path, module if path.name == "__init__.py" else module.rpartition(".")[0])
            self.parsed[module] = parsed
            self.follow(parsed.eager)


def required_modules(entries: Iterable[str | Path], packages: Mapping[str, Path]) -> AssetModules:
    """The modules of ``packages`` (top-level name -> folder) that ``entries`` need, each with its packages.

    An entry is a module name (it is part of the asset) or the path of a script placed beside the packages (only
    its imports are).
    """
    finder = _Finder(packages)
    for entry in entries:
        if isinstance(entry, Path):
            finder.follow(_parse(entry, None).eager)
        else:
            if finder.locate(entry) is None:
                raise ValueError(f"entry point {entry!r} is not a module of {sorted(packages)}")
            finder.require(entry)
        finder.run()
    return AssetModules(dict(sorted(finder.found.items())), finder.packages)


def _data_files(folder: Path) -> Iterator[Path]:
    """A package folder's own data: its non-Python files, and the files of its subfolders that are not packages."""
    for path in sorted(folder.iterdir()):
        if path.name in _CACHES:
            continue
        if path.is_file() and path.suffix not in (".py", ".pyc", ".pyo"):
            yield path
        elif path.is_dir() and not (path / "__init__.py").exists():
            yield from (p for p in sorted(path.rglob("*")) if p.is_file() and not _CACHES & set(p.parts))


def copy_asset(modules: AssetModules, destination: Path) -> list[Path]:
    """Copy the modules and their packages' data files into ``destination``; the files written, relative to it."""
    written: list[Path] = []
    for name, source in modules.modules.items():
        relative = modules.relative(name)
        copies = [(source, relative)]
        if source.name == "__init__.py":
            root = modules.packages[name.partition(".")[0]].parent
            copies += [(data, data.relative_to(root)) for data in _data_files(source.parent)]
        for origin, target in copies:
            (destination / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, destination / target)
            written.append(target)
    return sorted(written)
