"""Which package files a module imports, found by reading the source (nothing is imported).

The workflow makes these files a rule's code inputs, so editing any file a stage's entry point
imports, however deep, reruns that stage's jobs and nothing else. Every ``import`` statement
counts, also one inside a function (a lazy import is still code the job may run). Standard
library only: the workflow calls this while planning, before any job, without loading torch.
"""

from __future__ import annotations

import ast
import json
import os
from functools import cache
from pathlib import Path

PACKAGE = "cs336_systems"
# what files imported when last read, by (mtime, size): the workflow keeps it across runs
# (`use_cache`), so a rerun with nothing edited parses no file
_DISK: dict[str, list] = {}
_CACHE = {"file": None, "dirty": False}


def module_path(src: Path, name: str) -> Path | None:
    """The file of module `name` under the source folder `src` (a package: its __init__.py)."""
    base = Path(src, *name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _statements(body: list[ast.stmt]):
    """Every statement, however nested (function and class bodies, if/try/with/loop blocks):
    imports are statements, so expressions need not be walked (a tenth of the nodes)."""
    for node in body:
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                yield from _statements(block)


def use_cache(path: str | Path) -> None:
    """Keep what each file imports in `path` (JSON) between runs, keyed by mtime and size."""
    _CACHE["file"] = Path(path)
    try:
        _DISK.update(json.loads(Path(path).read_text()))
    except (OSError, ValueError):
        pass


def save_cache() -> None:
    """Write the cache (atomically) if a file was read since it was loaded."""
    path = _CACHE["file"]
    if path is None or not _CACHE["dirty"]:
        return
    _CACHE["dirty"] = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_DISK))
        os.replace(tmp, path)
    except OSError:
        pass


@cache
def _imports(path: Path, name: str) -> tuple[str, ...]:
    """Package modules that the file of module `name` imports (absolute names)."""
    key = f"{path}::{name}"
    stat = path.stat()
    known = _DISK.get(key)
    if known and known[:2] == [stat.st_mtime_ns, stat.st_size]:
        return tuple(known[2])
    found = _read_imports(path, name)
    if _CACHE["file"] is not None:
        _DISK[key] = [stat.st_mtime_ns, stat.st_size, list(found)]
        _CACHE["dirty"] = True
    return found


def _read_imports(path: Path, name: str) -> tuple[str, ...]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[str] = []
    for node in _statements(tree.body):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # relative: `from . import x` inside package p.q refers to p.q (package) or p
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                module = ".".join(parts + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append(module)
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            found += [f"{module}.{alias.name}" for alias in node.names if alias.name != "*"]
    return tuple(m for m in found if m == PACKAGE or m.startswith(PACKAGE + "."))


def _with_parents(name: str) -> list[str]:
    """Importing a.b.c runs a/__init__, a/b/__init__ and a/b/c."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_closure(src: str | Path, *modules: str, files: list[str | Path] = ()) -> list[Path]:
    """Every package file that importing (or `python -m`-running) `modules`, or running the
    scripts or test `files` (outside the package), may load, sorted.

    A package named as a module counts with its __main__.py, which `python -m` runs. Names that
    are not modules (a function imported with `from m import f`) are skipped.
    """
    src = Path(src)
    seen: set[str] = set()
    found: set[Path] = set()
    todo = [m for name in modules for m in _with_parents(name)]
    for script in files:
        todo += [m for name in _imports(Path(script), "__script__") for m in _with_parents(name)]
    for name in modules:
        path = module_path(src, name)
        if (
            path is not None
            and path.name == "__init__.py"
            and (path.parent / "__main__.py").is_file()
        ):
            todo.append(f"{name}.__main__")
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_path(src, name)
        if path is None:
            continue
        found.add(path)
        for imported in _imports(path, name):
            todo += [m for m in _with_parents(imported) if m not in seen]
    return sorted(found)


def digest(root: str | Path, files: list[str]) -> str:
    """A stamp's text: one `sha256  path` line per file (paths relative to `root`)."""
    import hashlib

    lines = [f"{hashlib.sha256(Path(root, f).read_bytes()).hexdigest()}  {f}" for f in files]
    return "\n".join(lines) + "\n"


def write_stamp(path: str | Path, text: str) -> bool:
    """Write `text` to `path` only when it differs (atomically): its mtime then moves only when
    a file it stands for changed. True when written."""
    path = Path(path)
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def stamp_files(path: str | Path) -> list[str]:
    """The files a stamp stands for."""
    return [line.split("  ", 1)[1] for line in Path(path).read_text().splitlines() if line]


def module_literal(src: str | Path, name: str, variable: str):
    """The value of ``variable = <literal>`` (annotated or not) at the top level of module
    `name`, read from its source: planning can read a table such as ``model.MODEL_SIZES``
    without importing the module (and torch)."""
    path = module_path(Path(src), name)
    if path is None:
        raise ModuleNotFoundError(f"no module {name!r} under {src}")
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == variable and node.value is not None:
            return ast.literal_eval(node.value)
    raise KeyError(f"{name} has no top-level literal {variable!r}")
