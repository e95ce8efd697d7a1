"""Only the Redis-layout module spells a run's keys or holds Lua.

Every key name and every Lua script of a run live in :mod:`pipeline.io.redis_layout`; the
other modules call :class:`~pipeline.io.redis_layout.RunKeys` and the named operations of the
io stores. This test walks every module of ``pipeline/``, ``producers/`` and ``bench/`` with
``ast`` and fails on a string that holds Lua (``redis.call``, ``KEYS[``, ``ARGV[``) or that
looks like a key of the layout: ``skewer:RUN:...``, or a key family of :class:`RunKeys`
followed by ``:`` (``"stats:routed"``, ``f"{prefix}ctl:rebalances"``). The families come from
:class:`RunKeys` itself, so a key added there is checked here at once. It is first shown to
find violations planted in a copy of a module.
"""

from __future__ import annotations

import ast
import inspect
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from pipeline.io import redis_layout
from pipeline.io.config import PROJECT_ROOT
from pipeline.io.redis_layout import RunKeys

SCANNED = ("pipeline", "producers", "bench")
LAYOUT_MODULE = Path(inspect.getfile(redis_layout)).resolve()
LUA_MARKERS = ("redis.call", "KEYS[", "ARGV[")
#: ``skewer:RUN:`` -- a key of a run spelled out (``skewer:local``, an image tag, is not one).
RUN_KEY = re.compile(r"^skewer:[^:\s]*:")


def key_families() -> set[str]:
    """The first part after the run's prefix of every key :class:`RunKeys` names."""
    keys = RunKeys("run")
    families = set()
    for name, member in inspect.getmembers(RunKeys):
        if name.startswith("_") or name in ("pattern",):
            continue
        if isinstance(member, property):
            value = getattr(keys, name)
        elif inspect.isfunction(member):
            parameters = list(inspect.signature(member).parameters)[1:]
            arguments = ["state" if p == "kind" else "0" for p in parameters]
            value = getattr(keys, name)(*arguments)
        else:
            continue
        assert value.startswith(keys.prefix), (name, value)
        families.add(value[len(keys.prefix) :].split(":")[0])
    return families


def _looks_like_key(text: str, families: set[str], after_value: bool = False) -> bool:
    if RUN_KEY.match(text):
        return True
    if after_value and text in families:  # f"{prefix}busy"
        return True
    family, colon, _ = text.partition(":")
    # A key has no spaces; a family right after an interpolated prefix is one too.
    return bool(colon) and family in families and (after_value or not re.search(r"\s", text))


def violations(path: Path, families: set[str]) -> list[str]:
    """``path:line: what`` for every Lua text or key literal in the module at ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            template = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)
            # a part right after an interpolated value: f"{prefix}ctl:rebalances"
            keyed = any(
                isinstance(part, ast.Constant)
                and _looks_like_key(part.value, families, after_value=i > 0)
                for i, part in enumerate(parts)
            )
            if keyed or template.startswith("skewer:{}"):
                found.append(f"{path}:{node.lineno}: key {template!r}")
            for part in parts:  # so ast.walk does not see them again as plain strings
                part.__dict__["in_f_string"] = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.__dict__.get("in_f_string"):
                continue
            text = node.value
            if any(marker in text for marker in LUA_MARKERS):
                found.append(f"{path}:{node.lineno}: Lua {text[:40]!r}")
            elif _looks_like_key(text, families):
                found.append(f"{path}:{node.lineno}: key {text!r}")
    return found


def scanned_modules(root: Path, packages: Iterable[str] = SCANNED) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (root / package).rglob("*.py")
        if path.resolve() != LAYOUT_MODULE
    )


def test_the_families_come_from_run_keys() -> None:
    families = key_families()
    assert {"state", "stats", "ctl", "windows", "wm", "truth", "sources", "input"} <= families


def test_the_check_finds_a_planted_key_and_a_planted_script(tmp_path: Path) -> None:
    families = key_families()
    module = tmp_path / "pipeline" / "stages" / "user_topic.py"
    module.parent.mkdir(parents=True)
    shutil.copy(PROJECT_ROOT / "pipeline" / "stages" / "user_topic.py", module)
    assert violations(module, families) == []
    module.write_text(
        module.read_text()
        + "\nROUTED = 'stats:routed'\n"
        + "def late(prefix: str) -> str:\n    return f'{prefix}stats:late_input'\n"
        + "def anyone(run: str) -> str:\n    return f'skewer:{run}:input'\n"
        + "SCRIPT = \"return redis.call('GET', KEYS[1])\"\n"
    )
    found = violations(module, families)
    kinds = sorted(line.split(": ", 1)[1].split(" ")[0] for line in found)
    assert kinds == ["Lua", "key", "key", "key"], found
    assert scanned_modules(tmp_path) == [module]


def test_only_the_layout_module_spells_keys_or_holds_lua() -> None:
    families = key_families()
    found = [v for path in scanned_modules(PROJECT_ROOT) for v in violations(path, families)]
    assert found == [], "\n".join(found)
